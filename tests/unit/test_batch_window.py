"""The engine's side of the batch window and the start's idle rule (the window itself is the
coordinator's, tests/unit/test_coordinator.py), the Foreground and the workflow thread's timers."""

from __future__ import annotations

import time
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.machinery.threads import Foreground
from dex.app.runtime import coordinator as co
from dex.app.runtime.rounds import LocalDispatch
from dex.app.workflows.worker import WorkflowWorker
from dex.testing import VirtualClock


class Workflows:
    """What LocalDispatch reads of the workflow worker."""

    names = frozenset({"wf"})
    lease = None

    def __init__(self, idle: float) -> None:
        self.idle = idle

    def backlog(self) -> int:
        return 0

    def idle_for(self) -> float:
        return self.idle


def dispatch(workflows: Any, idle_after: float) -> LocalDispatch:
    settings = co.Settings(poll_interval=1, window=idle_after, activity_capacity=4, activity_batch=4, workflow_batch=8)
    coordinator = co.Coordinator(settings, wake=lambda topics: None, run=lambda task: None)
    return LocalDispatch(
        coordinator,
        activities=None,  # type: ignore[arg-type]
        workflows=workflows,
        owner="node",
        wake_workflows=lambda: None,
        idle_after=idle_after,
    )


def test_a_start_claims_its_task_only_after_a_whole_idle_window() -> None:
    busy = dispatch(Workflows(idle=0.005), idle_after=0.02)
    assert busy.start_claim() is None  # the worker ran a task 5 ms ago: the scheduler batches it
    idle = dispatch(Workflows(idle=0.5), idle_after=0.02)
    claim = idle.start_claim()
    assert claim is not None and claim.names == frozenset({"wf"}) and claim.limit == 1
    assert dispatch(Workflows(idle=0.0), idle_after=0.0).start_claim() is not None  # window off


@pytest.mark.parametrize("bad", [-0.01, "soon", True])
def test_a_bad_batch_window_is_refused_by_name(bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_window must be a number of seconds >= 0"):
        dex.Engine(InMemoryAdapter(clock=VirtualClock()), batch_window=bad)


@dex.workflow
async def quick(ctx: dex.WorkflowContext) -> int:
    return 1


def _worker(engine: dex.Engine, **options: Any) -> WorkflowWorker:
    """A workflow worker over the engine's store and buffer, built with ``options``."""
    return WorkflowWorker(engine.store, engine.registry, engine.converter, engine.buffer, engine.node_id, **options)


def test_the_worker_says_whether_its_claim_came_back_full() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick])
    worker = _worker(engine, batch_size=2)  # a small batch to fill
    for _ in range(3):
        engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    assert worker.poll_once() == 2
    assert worker.claimed_full  # two asked, two claimed: the third may wait
    assert worker.poll_once() == 1
    assert not worker.claimed_full


def test_the_foreground_counts_calls_in_flight_and_asks_the_worker_to_step_aside() -> None:
    foreground = Foreground(pause=0.0001)
    assert not foreground.busy() and not foreground.step_aside()  # nobody waits: no pause
    with foreground.calling():
        assert foreground.busy() and foreground.step_aside()
    with pytest.raises(RuntimeError), foreground.calling():
        raise RuntimeError("the store refused")
    assert not foreground.busy()  # a call that failed is no longer in flight
    with foreground.calling():
        assert not Foreground(pause=0).step_aside()  # a zero pause turns it off


class RecordingForeground(Foreground):
    def __init__(self) -> None:
        super().__init__(pause=0)
        self.asked = 0

    def step_aside(self) -> bool:
        self.asked += 1
        return False


def test_the_workflow_worker_steps_aside_after_each_task() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick])
    recording = RecordingForeground()
    worker = _worker(engine, foreground=recording)
    for _ in range(3):
        engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    assert worker.poll_once() == 3
    assert recording.asked == 3


class WatchingStore(InMemoryAdapter):
    """Notes whether the engine counted the call in flight while the store served it."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.foreground: Foreground | None = None
        self.seen: list[bool] = []

    def create_run(self, run_id: Any, created: Any, now: Any) -> str:
        assert self.foreground is not None
        self.seen.append(self.foreground.busy())
        return super().create_run(run_id, created, now)

    def request_transition(self, run_id: Any, target: Any, message: Any, now: Any) -> None:
        assert self.foreground is not None
        self.seen.append(self.foreground.busy())
        super().request_transition(run_id, target, message, now)


def test_starts_and_transitions_are_calls_in_flight() -> None:
    store = WatchingStore()
    engine = dex.Engine(store, workflows=[quick])
    store.foreground = engine.foreground
    run_id = engine.start_workflow(quick)
    engine.cancel(run_id)
    assert store.seen == [True, True]
    assert not engine.foreground.busy()


def _window_left(engine: dex.Engine, key: str) -> float:
    coordinator = engine.runtime.coordinator
    return co.window_left(coordinator.settings, coordinator.state, key, time.monotonic())


def _worked(engine: dex.Engine, key: str) -> None:
    """As a round of ``key`` that found work does: its window begins."""
    coordinator = engine.runtime.coordinator
    coordinator.state = co._worked(coordinator.state, key, time.monotonic())


def test_a_scheduler_round_that_made_tasks_lets_the_worker_claim_them_at_once() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick], batch_window=60)
    _worked(engine, "workflow")  # a claim just found work
    assert _window_left(engine, "workflow") > 50
    engine.start_workflow(quick)
    assert engine.runtime.rounds.scheduler() == 0.0  # it made a task: straight back
    assert _window_left(engine, "workflow") == 0.0  # the round's tasks are the batch: no wait
    assert "workflow" in engine.runtime.coordinator.state.wanted  # and the worker claims them


def test_a_written_task_hurries_a_scheduler_inside_its_window() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick], batch_window=3600)
    engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    _worked(engine, "scheduler")  # as a scheduler round that found work does
    assert _window_left(engine, "scheduler") > 0
    engine.workflow_worker.poll_once()
    engine.buffer.flush()  # the task's result is written: the task has left its queue
    assert _window_left(engine, "scheduler") == 0.0
