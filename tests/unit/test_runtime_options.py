"""An engine's runtime is built from what its constructor receives (``Engine(runtime_options=...)``):
the simulator's clock, attempt pool, watchdog settings, randomness and observers reach the parts
that use them, with nothing set on a part afterwards."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.activities.attempts import Durations
from dex.app.ports.store import WorkflowTask
from dex.app.runtime import coordinator as co
from dex.app.runtime.options import RuntimeOptions
from dex.simulation.pool import SimulatedPool
from dex.testing import VirtualClock


@dex.activity(name="opt-double")
def double(x: int) -> int:
    return 2 * x


@dex.workflow(name="opt-twice")
async def twice(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(double, await ctx.activity(double, x))  # type: ignore[no-any-return]


class Seen:
    def __init__(self) -> None:
        self.events: list[co.Event] = []
        self.handed: list[int] = []
        self.pools: list[int] = []

    def observe(self, event: co.Event, _commands: tuple[co.Command, ...]) -> None:
        self.events.append(event)

    def hand(self, tasks: Sequence[WorkflowTask]) -> None:
        self.handed.append(len(tasks))


def _engine(clock: VirtualClock, seen: Seen, pool: SimulatedPool, **options: Any) -> dex.Engine:
    now = [100.0]

    def make_pool(threads: int) -> SimulatedPool:
        seen.pools.append(threads)
        return pool

    runtime_options = RuntimeOptions(
        monotonic=lambda: now[0],
        attempt_pool=make_pool,
        group_threads=0,
        await_on_loop=False,
        interrupt=False,
        slots_ttl=0.0,
        jitter=random.Random(1),
        workflow_round=1,
        activity_claim=1,
        observe=seen.observe,
        handed=seen.hand,
        **options,
    )
    return dex.Engine(
        InMemoryAdapter(clock=clock),
        workflows=[twice],
        activities=[double],
        node_id="opt",
        activity_concurrency=3,
        inline_activity_seconds=0,
        runtime_options=runtime_options,
    )


def test_an_armed_engine_runs_its_rounds_over_the_parts_it_was_given() -> None:
    """Armed without threads, the engine's rounds claim into the given pool (made with the
    engine's activity_concurrency), its coordinator's events carry the given clock's times
    and go to the observer, completions hand workflow tasks to the worker through the
    ``handed`` observer, and a watchdog on the given clock stands in what a start lends."""
    clock, seen, pool = VirtualClock(), Seen(), SimulatedPool()
    engine = _engine(clock, seen, pool)
    runtime = engine.runtime
    rounds = runtime.rounds
    assert runtime.started is None and runtime.watchdog is None
    runtime.arm()
    assert seen.pools == [3]
    assert runtime.watchdog is not None and runtime.started is not None
    assert runtime.started.inline is None and runtime.started.groups is None
    assert engine.runtime.rounds is rounds  # built once, whatever starts and stops

    run_id = engine.start_workflow(twice, 5)
    for _ in range(50):
        rounds.scheduler()
        rounds.workflows()
        rounds.activities()
        pool.run_all()
        rounds.flush("activity outcomes")
        rounds.flush("workflow results")
        if engine.get_run(run_id).status is dex.RunStatus.COMPLETED:
            break
    assert engine.get_run(run_id).result == 20
    assert seen.handed and sum(seen.handed) >= 1  # eager dispatch handed workflow tasks over
    times = [event.now for event in seen.events if isinstance(event, co.SchedulerTurn)]
    assert times and set(times) == {100.0}  # the given clock, not time.monotonic()
    assert runtime.watchdog.step() == 0  # nothing blocked; stepped by hand, as the simulator does
    engine.stop(timeout=0)
    assert runtime.started is None and runtime.watchdog is None and engine.runtime.rounds is rounds


def test_the_given_durations_decide_what_runs_inline() -> None:
    clock, seen, pool = VirtualClock(), Seen(), SimulatedPool()
    durations = Durations()
    durations.record("opt-double", 0.0)
    engine = _engine(clock, seen, pool, durations=durations)
    assert engine.activity_worker.durations is durations


@pytest.mark.parametrize("field", ["workflow_round", "activity_claim"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_bad_sizes_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RuntimeOptions(**{field: value})
