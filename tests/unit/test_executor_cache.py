"""A run's next workflow task continues from the cached executor instead of replaying."""

from __future__ import annotations

import gc
from typing import Any

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain.coroutines import CLOSE_THROWS, CoroutineStepper, DexFuture
from dex.testing import VirtualClock

loop_turns: list[int] = []


@dex.activity
def inc(x: int) -> int:
    return x + 1


@dex.workflow
async def counter_loop(ctx: dex.WorkflowContext, n: int) -> int:
    x = 0
    for i in range(n):
        loop_turns.append(i)  # instrumentation: counts how often the code really runs
        x = await ctx.activity(inc, x)
    return x


def _engine(store: Any, **kwargs: Any) -> dex.Engine:
    return dex.Engine(store, workflows=[counter_loop], activities=[inc], **kwargs)


def test_cached_executor_runs_each_step_once() -> None:
    loop_turns.clear()
    engine = _engine(InMemoryAdapter(clock=VirtualClock()))
    run_id = engine.start_workflow(counter_loop, 50)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 50
    assert len(loop_turns) == 50  # without the cache: 50 * 51 / 2
    assert len(engine.workflow_worker.cache) == 0  # finished runs leave the cache


def test_without_a_cache_every_task_replays_from_the_start() -> None:
    loop_turns.clear()
    engine = _engine(InMemoryAdapter(clock=VirtualClock()), executor_cache_size=0)
    run_id = engine.start_workflow(counter_loop, 10)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 10
    assert len(loop_turns) == sum(range(1, 11)) + 10  # task k re-runs k turns; the last one all ten


def test_a_stale_cache_entry_is_not_used_when_another_node_moved_the_run() -> None:
    loop_turns.clear()
    store = InMemoryAdapter(clock=VirtualClock())
    first, second = _engine(store), _engine(store)
    run_id = first.start_workflow(counter_loop, 6)
    # alternate the nodes task by task: each finds history the other wrote
    for turn in range(40):
        engine = (first, second)[turn % 2]
        engine.workflow_scheduler.step()
        engine.workflow_worker.poll_once()
        engine.buffer.flush()
        engine.activity_scheduler.step()
        engine.activity_worker.poll_once()
        engine.buffer.flush()
    assert first.wait(run_id, timeout=1) == 6
    dex.testing.replay(counter_loop, first.history(run_id))


def test_a_discarded_result_drops_the_cache_entry() -> None:
    store = InMemoryAdapter(clock=VirtualClock())
    engine = _engine(store)
    run_id = engine.start_workflow(counter_loop, 3)
    engine.workflow_scheduler.step()
    (task,) = store.claim_workflow_tasks(
        {"counter_loop"}, "someone-else", store.clock.now(), engine.workflow_worker._lease, 1
    )
    result = engine.workflow_worker.execute(task)
    assert result is not None
    engine.buffer.add_workflow_result(task, result)
    assert len(engine.workflow_worker.cache) == 0  # not before the store has applied it
    # another node takes the task over before our result is written
    store.clock.advance(engine.workflow_worker._lease * 2)  # type: ignore[attr-defined]
    store.claim_workflow_tasks({"counter_loop"}, "usurper", store.clock.now(), engine.workflow_worker._lease, 1)
    engine.buffer.flush()
    assert engine.buffer.discarded == 1
    assert len(engine.workflow_worker.cache) == 0
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 3


def test_a_coroutine_that_keeps_awaiting_when_closed_is_abandoned_after_a_few_throws() -> None:
    throws: list[type[BaseException]] = []

    async def refuses() -> None:
        while True:
            try:
                await DexFuture("never done")
            except BaseException as exc:  # noqa: BLE001 - the close, each time
                throws.append(type(exc))

    stepper = CoroutineStepper()
    stepper.spawn(refuses())
    stepper.run_until_blocked()
    assert stepper.close() == 1  # abandoned, and closing ended
    gc.collect()
    # thrown in CLOSE_THROWS times; then the garbage collector's finalizer, once (no more)
    assert throws == [GeneratorExit] * (CLOSE_THROWS + 1)
    assert stepper.close() == 0  # reported once
    later = refuses()
    stepper.spawn(later)  # a closed stepper runs nothing more
    stepper.run_until_blocked()
    assert later.cr_frame is None and len(throws) == CLOSE_THROWS + 1


def test_a_finally_that_awaits_once_still_closes() -> None:
    unwound: list[str] = []

    async def awaits_in_finally() -> None:
        try:
            await DexFuture("never done")
        finally:
            try:
                await DexFuture("in finally")
            finally:
                unwound.append("out")

    stepper = CoroutineStepper()
    stepper.spawn(awaits_in_finally())
    stepper.run_until_blocked()
    assert stepper.close() == 0
    assert unwound == ["out"]
