"""A cached executor that is dropped is closed at once and replay-silent (SPEC §8), on every adapter.

Its workflow code's ``finally`` blocks then run with ``ctx.is_replaying`` True and issue
nothing: no side effect runs, no log line is written. An executor left to the garbage
collector would run them as if live, and repeat side effects.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest

import dex
from dex.app.executors import ExecutorCache

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
    small = ExecutorCache(0)
    small.put(run_id, entry.executor, entry.last_seq)  # evicted at once
    assert finals == [True]
    assert effects == []


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
    assert finals == [True]
    assert effects == []
    cache.clear()
