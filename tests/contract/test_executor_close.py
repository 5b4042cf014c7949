"""A cached executor that is dropped is closed at once and replay-silent (docs/reference/contract.md §8), on every adapter.

Its workflow code's ``finally`` blocks then run with ``ctx.is_replaying`` True and issue
nothing: no side effect runs, no log line is written. An executor left to the garbage
collector would run them as if live, and repeat side effects.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

import pytest

import dex
from dex.adapters.observability.prometheus import PrometheusTelemetry
from dex.app.workflows.executors import Closer, ExecutorCache
from dex.domain.task import replay_history

finals: list[bool] = []  # ctx.is_replaying in each run of the finally block
effects: list[str] = []  # side effects that really ran


def _cleanup() -> str:
    effects.append("cleanup")
    return "cleaned"


@dex.workflow
async def guarded(ctx: dex.WorkflowContext, x: int) -> int:
    try:
        await ctx.wait_for_event("go")
        return x
    finally:
        finals.append(ctx.is_replaying)
        ctx.logger.warning("finally of %s", ctx.run_id)
        ctx.set_status("finally")
        ctx.side_effect("cleanup", _cleanup)


@dex.workflow
async def awaits_in_finally(ctx: dex.WorkflowContext) -> int:
    try:
        await ctx.wait_for_event("go")
        return 1
    finally:
        finals.append(ctx.is_replaying)
        await ctx.sleep(1)  # awaiting while being closed must not crash the closer
        effects.append("after the await")


@pytest.fixture(autouse=True)
def _clear() -> None:
    finals.clear()
    effects.clear()


def _waiting(make_engine: Any, workflow: Any, *args: Any) -> tuple[dex.Engine, str]:
    """An engine with one run waiting for an event, its executor in the cache."""
    engine: dex.Engine = make_engine([workflow], [])
    run_id = engine.start_workflow(workflow, *args)
    engine.drain()
    assert len(engine.workflow_worker.cache) == 1
    return engine, run_id


def test_an_executor_dropped_by_a_failed_load_is_closed_at_once_silently(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine, run_id = _waiting(make_engine, guarded, 7)
    store = engine.store
    load = store.load_workflow_tasks
    failures = [ConnectionError("the store is away")]

    def flaky_load(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return load(*args, **kwargs)

    store.load_workflow_tasks = flaky_load  # type: ignore[method-assign]
    engine.send_event(run_id, "go")
    caplog.set_level(logging.WARNING, logger="dex.workflow")
    engine.drain(advance_time=False)  # the failed load gives the task back, to be retried after a backoff
    gc.collect()  # an executor left to the garbage collector would run its finally block now

    assert failures == []  # the load did fail once
    assert finals == [True]  # closed at once, while replay-silent
    assert effects == []
    assert len(engine.workflow_worker.cache) == 0
    assert not [r for r in caplog.records if r.name.startswith("dex.workflow")]

    engine.drain()  # the retry comes due and the store answers: the task is redone from the full history
    assert engine.wait(run_id, timeout=5) == 7
    gc.collect()
    assert finals == [True, False]  # then the redone task reaches the finally once, live, at the end
    assert effects == ["cleanup"]  # the side effect ran exactly once
    assert engine.get_run(run_id).custom_status == "finally"


def test_a_finally_that_awaits_does_not_crash_the_closer(make_engine: Any) -> None:
    engine, run_id = _waiting(make_engine, awaits_in_finally)
    engine.workflow_worker.forget()  # as on stop: every executor it holds is closed
    assert finals == [True]
    assert effects == []  # the await stopped the code: nothing after it ran
    engine.send_event(run_id, "go")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 1


def test_evicted_executors_are_closed_silently(make_engine: Any) -> None:
    engine, run_id = _waiting(make_engine, guarded, 1)
    cache: ExecutorCache = engine.workflow_worker.cache
    entry = cache.take(run_id)
    assert entry is not None
    closer = Closer()
    small = ExecutorCache(0, closer)
    small.put(run_id, entry.executor, entry.last_seq)  # evicted at once: dropped
    assert finals == [] and len(closer) == 1  # no workflow code runs in the thread that evicts
    assert closer.close_dropped() == 1  # the worker's thread closes it
    assert finals == [True]
    assert effects == []


@dex.workflow
async def quick(ctx: dex.WorkflowContext, x: int) -> int:
    return x


def test_a_dropped_executor_whose_code_ended_is_closed_at_once_and_one_suspended_waits(make_engine: Any) -> None:
    engine: dex.Engine = make_engine([guarded, quick], [])
    waiting = engine.start_workflow(guarded, 1)
    finished = engine.start_workflow(quick, 2)
    engine.drain()
    assert engine.wait(finished, timeout=5) == 2
    # a finished run's executor: every coroutine returned, so its close runs no code and is
    # done by whoever drops it (its objects freed now, not after the worker's round)
    ended = replay_history(quick.__dex_workflow__, finished, engine.history(finished), engine.converter)
    assert ended.code_ended
    closer = Closer()
    closer(ended)
    assert ended.closed and len(closer) == 0
    # a suspended one would run its finally: queued for the worker's thread, as before
    entry = engine.workflow_worker.cache.take(waiting)
    assert entry is not None and not entry.executor.code_ended
    closer(entry.executor)
    assert len(closer) == 1 and finals == [] and not entry.executor.closed
    assert closer.close_dropped() == 1
    assert finals == [True] and effects == []


def test_an_executor_replaced_in_the_cache_is_closed_silently(make_engine: Any) -> None:
    engine, run_id = _waiting(make_engine, guarded, 1)
    cache: ExecutorCache = engine.workflow_worker.cache
    entry = cache.take(run_id)
    assert entry is not None
    other, _other_id = _waiting(make_engine, guarded, 2)
    newer = other.workflow_worker.cache.take(_other_id)
    assert newer is not None
    cache.put(run_id, entry.executor, entry.last_seq)
    cache.put(run_id, newer.executor, newer.last_seq)  # the first one is dropped
    engine.workflow_worker.close_dropped()
    assert finals == [True]
    assert effects == []
    cache.clear()
    engine.workflow_worker.close_dropped()


# -- code that refuses to close -------------------------------------------------------------------


@dex.workflow
async def sleeps_through_close(ctx: dex.WorkflowContext) -> None:
    while True:  # catches the close, and awaits again: for ever
        try:
            await ctx.sleep(3600)
        except BaseException:  # noqa: BLE001 - hostile on purpose
            pass


@dex.workflow
async def stubborn(ctx: dex.WorkflowContext) -> list[int]:
    got: list[int] = []
    while len(got) < 2:
        try:
            got.append(await ctx.wait_for_event("go"))
        except BaseException:  # noqa: BLE001 - the close too: it awaits again
            finals.append(ctx.is_replaying)
    return got


@dex.activity
def plus_one(x: int) -> int:
    return x + 1


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(plus_one, x)  # type: ignore[no-any-return]


def test_code_that_refuses_to_close_is_abandoned_counted_and_its_run_goes_on(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    engine: dex.Engine = make_engine([stubborn, guarded], [], executor_cache_size=1)
    run_id = engine.start_workflow(stubborn)
    engine.drain(advance_time=False)
    other = engine.start_workflow(guarded, 5)
    engine.drain(advance_time=False)  # the other run's executor evicts the stubborn one: closed, refused
    assert engine.health().abandoned_executors == 1
    assert finals == [True, True, True]  # thrown in three times, silently each, then abandoned
    assert any(run_id in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)

    engine.send_event(run_id, "go", 1)  # its next task replays it on a fresh executor
    engine.drain(advance_time=False)
    engine.send_event(run_id, "go", 2)
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == [1, 2]
    engine.send_event(other, "go")
    engine.drain(advance_time=False)
    assert engine.wait(other, timeout=5) == 5
    assert effects == ["cleanup"]  # the healthy run's side effect ran once, live
    gc.collect()  # the abandoned coroutine's finalizer runs its code once more: silently, issuing nothing
    assert effects == ["cleanup"]


def test_a_started_engine_with_code_that_refuses_to_close_goes_on_and_stops(make_engine: Any) -> None:
    engine: dex.Engine = make_engine(
        [sleeps_through_close, healthy], [plus_one], executor_cache_size=1, poll_interval=0.01
    )
    metrics = PrometheusTelemetry()
    engine.telemetry.attach(metrics)
    engine.start()
    hostile = engine.start_workflow(sleeps_through_close)
    deadline = time.monotonic() + 10
    while "TimerCreated" not in [event.kind for event in engine.history(hostile)]:
        assert time.monotonic() < deadline, "the hostile run never started its timer"
        time.sleep(0.01)
    # each healthy run's executor, cached, evicts the one before it: the hostile one's close is
    # refused in the flusher thread, which must go on writing
    for x in range(3):
        ok = engine.start_workflow(healthy, x)
        assert engine.wait(ok, timeout=10) == x + 1
    health = engine.health()
    assert health.abandoned_executors >= 1
    assert health.threads_alive
    total = metrics.registry.get_sample_value("dex_abandoned_executors_total", {"workflow": "sleeps_through_close"})
    assert total == health.abandoned_executors
    stopping = threading.Thread(target=engine.stop, kwargs={"timeout": 5})
    stopping.start()
    stopping.join(60)
    assert not stopping.is_alive()  # stop() returned (it never did while the close spun)
    assert not engine.get_run(hostile).status.is_terminal


spinning = {"on": False}


@dex.workflow
async def spins_in_finally(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_for_event("go")
        return "went"
    finally:
        while spinning["on"]:  # a CPU loop in the code its close runs
            pass


def test_a_close_that_blocks_is_interrupted_by_the_watchdog_and_the_engine_goes_on(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    spinning["on"] = True
    engine: dex.Engine = make_engine(
        [spins_in_finally, healthy],
        [plus_one],
        executor_cache_size=1,
        poll_interval=0.01,
        workflow_task_deadline=0.5,
    )
    engine.start()
    try:
        blocking = engine.start_workflow(spins_in_finally)
        deadline = time.monotonic() + 10
        while "WorkflowTaskCompleted" not in [event.kind for event in engine.history(blocking)]:
            assert time.monotonic() < deadline, "the run never waited for its event"
            time.sleep(0.01)
        # healthy runs evict its executor: its close spins, in the workflow worker's thread (never
        # the flusher's), where the watchdog interrupts it and a fresh thread goes on
        for x in range(3):
            ok = engine.start_workflow(healthy, x)
            assert engine.wait(ok, timeout=10) == x + 1
        while not any("closing the executor of run " + blocking in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline + 10, "the blocked close was not reported"
            time.sleep(0.01)
        assert engine.health().threads_alive
    finally:
        spinning["on"] = False
    # its run lost nothing: the next task replays it on a fresh executor
    engine.send_event(blocking, "go")
    assert engine.wait(blocking, timeout=10) == "went"


def test_a_finished_runs_executor_is_freed_without_the_garbage_collector(make_engine: Any) -> None:
    # no reference cycle through the executor (its context, its block cursor): a finished run's
    # objects go when the worker drops them, not when the collector next walks the heap
    engine: dex.Engine = make_engine([quick], [])
    run_id = engine.start_workflow(quick, 3)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 3
    history = engine.history(run_id)
    gc.disable()
    try:
        executor = replay_history(quick.__dex_workflow__, run_id, history, engine.converter)
        assert executor.code_ended
        Closer()(executor)
        gone = weakref.ref(executor)
        del executor
        assert gone() is None
    finally:
        gc.enable()
