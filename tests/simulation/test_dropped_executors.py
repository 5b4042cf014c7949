"""No executor of a simulated node is left to the garbage collector unclosed: neither the
nodes a crash replaces nor those standing when the simulation ends (a stopping engine closes its
own). Left to it, an executor whose workflow coroutine never started (a run suspended in the
block that started it) made Python warn "coroutine ... was never awaited"."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

import dex
import dex.testing
from dex.adapters.memory import InMemoryAdapter
from dex.domain import replay
from dex.domain.status import RunStatus
from dex.simulation import Fault, Simulator
from dex.testing import VirtualClock
from tests.simulation.test_simulation import STEPS


@pytest.fixture
def unclosed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the workflows whose executors were collected without being closed."""
    dropped: list[str] = []
    closed: set[int] = set()
    made, close = replay.WorkflowExecutor.__init__, replay.WorkflowExecutor.close

    def init(self: replay.WorkflowExecutor, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)  # type: ignore[arg-type]
        key, name = id(self), self.workflow_name
        weakref.finalize(self, lambda: None if key in closed else dropped.append(name))
        closed.discard(key)

    def closing(self: replay.WorkflowExecutor) -> None:
        closed.add(id(self))
        close(self)

    monkeypatch.setattr(replay.WorkflowExecutor, "__init__", init)
    monkeypatch.setattr(replay.WorkflowExecutor, "close", closing)
    yield dropped


@pytest.mark.parametrize("seed", range(6))
def test_a_simulation_leaves_no_executor_unclosed(seed: int, unclosed: list[str]) -> None:
    faults = [Fault(at, "crash", pick) for at, pick in ((60, 0), (150, 1), (260, 2))]
    Simulator(seed, faults, steps=STEPS).run()
    gc.collect()
    assert unclosed == []


@dex.workflow
async def waits_for_go(ctx: dex.WorkflowContext) -> str:
    return str(await ctx.wait_for_event("go"))


def test_replaying_a_run_that_waits_leaves_nothing_unclosed(unclosed: list[str]) -> None:
    """``dex.testing.replay`` of a run's history that ends with its code waiting: the replay's
    executor is closed at once, not left to the garbage collector (which would warn if its
    coroutine had not started yet)."""
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[waits_for_go])
    run_id = engine.start_workflow(waits_for_go)
    engine.drain()
    assert engine.get_run(run_id).status is RunStatus.RUNNING
    history = engine.export_history(run_id)
    dex.testing.replay(waits_for_go, history)
    gc.collect()
    assert unclosed == []
    engine.send_event(run_id, "go", "now")  # the engine's own run goes on
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "now"
