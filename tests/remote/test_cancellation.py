"""Python activities learn of cancellation (docs/reference/contract.md §13): ``activity_context().cancel_requested``
turns True and ``heartbeat()`` False once the run is cancelled; an ``async def`` activity is
cancelled at its next await; nothing the attempt returns afterwards is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import dex
from dex.domain import events as ev
from dex.domain.status import RunStatus

seen: dict[str, Any] = {}
started = threading.Event()


@dex.activity(name="cancel-sync", lock_timeout=timedelta(minutes=5))
def watch_sync() -> str:
    context = dex.activity_context()
    seen["sync_before"] = (context.cancel_requested, context.heartbeat())
    started.set()
    deadline = time.monotonic() + 20
    while not context.cancel_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    seen["sync_after"] = (context.cancel_requested, context.heartbeat(), time.monotonic())
    return "finished anyway"  # not recorded: the run is cancelled


@dex.activity(name="cancel-async", lock_timeout=timedelta(minutes=5))
async def watch_async() -> str:
    started.set()
    try:
        await asyncio.sleep(20)
    except asyncio.CancelledError:
        seen["async_cancelled_at"] = time.monotonic()
        seen["async_context"] = dex.activity_context().cancel_requested
        raise
    return "slept"


@dex.workflow(name="cancel-one")
async def cancel_one(ctx: dex.WorkflowContext, name: str) -> Any:
    return await ctx.activity(name)


@dex.activity(name="cancel-quick")
def quick(x: int) -> int:
    return x + 1


@dex.workflow(name="cancel-healthy")
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(quick, x)  # type: ignore[no-any-return]


def _engine(store_factory: Callable[[], Any]) -> dex.Engine:
    return dex.Engine(
        store_factory(),
        workflows=[cancel_one, healthy],
        activities=[watch_sync, watch_async, quick],
        poll_interval=0.02,
    )


def _cancel_when_started(engine: dex.Engine, name: str) -> tuple[str, float]:
    seen.clear()
    started.clear()
    run_id = engine.start_workflow(cancel_one, name)
    assert started.wait(10), "the activity never started"
    time.sleep(0.1)
    cancelled_at = time.monotonic()
    engine.cancel(run_id)
    return run_id, cancelled_at


def _nothing_recorded(engine: dex.Engine, run_id: str) -> None:
    assert engine.get_run(run_id).status is RunStatus.CANCELLED
    time.sleep(0.3)  # whatever the attempt returned has had time to be written, if it were
    kinds = [type(item.event) for item in engine.history(run_id)]
    assert ev.ActivityTaskCompleted not in kinds and ev.ActivityTaskFailed not in kinds


def test_a_sync_activity_sees_cancel_requested_and_its_result_is_dropped(store_factory: Callable[[], Any]) -> None:
    with _engine(store_factory) as engine:
        run_id, cancelled_at = _cancel_when_started(engine, "cancel-sync")
        with contextlib.suppress(dex.WorkflowCancelledError):
            engine.wait(run_id, timeout=10)
        deadline = time.monotonic() + 10
        while "sync_after" not in seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert seen["sync_before"] == (False, True)
        requested, heartbeat, at = seen["sync_after"]
        assert (requested, heartbeat) == (True, False)
        assert at - cancelled_at < 5  # a second or two (a bound, not a speed figure)
        _nothing_recorded(engine, run_id)
        assert engine.wait(engine.start_workflow(healthy, 1), timeout=10) == 2


def test_an_async_activity_is_cancelled_at_its_next_await(store_factory: Callable[[], Any]) -> None:
    with _engine(store_factory) as engine:
        run_id, cancelled_at = _cancel_when_started(engine, "cancel-async")
        deadline = time.monotonic() + 10
        while "async_cancelled_at" not in seen:
            assert time.monotonic() < deadline, "the coroutine was never cancelled"
            time.sleep(0.02)
        assert seen["async_cancelled_at"] - cancelled_at < 5
        assert seen["async_context"] is True
        _nothing_recorded(engine, run_id)
        assert engine.wait(engine.start_workflow(healthy, 2), timeout=10) == 3
