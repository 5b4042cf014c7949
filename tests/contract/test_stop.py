"""``engine.stop(timeout)`` returns in time (SPEC §8), on every adapter.

An activity attempt still running when the timeout runs out is abandoned to its lease: the
stopped engine writes nothing for it later (not its outcome, not a heartbeat), and a fresh
engine runs the task again once the lease lapses. The blocking activity waits on an Event that
the test releases at its end, so no thread outlives the test by seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock

RELEASE = threading.Event()  # lets the first attempt end (it would take 8 s otherwise)
STARTED = threading.Event()
ENDED = threading.Event()
attempts: list[int] = []
heartbeats_after_stop: list[bool] = []


@dex.activity(name="stop-blocks", lock_timeout=timedelta(seconds=30))
def blocks(x: int) -> int:
    attempt = dex.activity_context().attempt
    attempts.append(attempt)
    if attempt == 1:
        STARTED.set()
        RELEASE.wait(8)
        heartbeats_after_stop.append(dex.activity_context().heartbeat())
        ENDED.set()
    return x * 10


@dex.activity(name="stop-blocks-async", lock_timeout=timedelta(seconds=30))
async def blocks_async(x: int) -> int:
    attempt = dex.activity_context().attempt
    attempts.append(attempt)
    if attempt == 1:
        STARTED.set()
        try:
            for _ in range(800):  # 8 s, unless released or cancelled
                if RELEASE.is_set():
                    break
                await asyncio.sleep(0.01)
        finally:
            ENDED.set()
    return x * 10


@dex.workflow(name="stop-waits")
async def waits(ctx: dex.WorkflowContext, x: int, is_async: bool) -> int:
    return await ctx.activity(blocks_async if is_async else blocks, x)  # type: ignore[no-any-return]


@pytest.fixture
def released() -> Iterator[None]:
    for event in (RELEASE, STARTED, ENDED):
        event.clear()
    attempts.clear()
    heartbeats_after_stop.clear()
    yield
    RELEASE.set()  # a failed test must not leave an 8 s thread behind
    ENDED.wait(5)


@pytest.mark.parametrize("is_async", [False, True], ids=["thread", "async"])
def test_stop_returns_within_its_timeout_and_abandons_a_long_attempt_to_its_lease(
    adapter_factory: Any, clock: VirtualClock, released: None, is_async: bool
) -> None:
    kinds = {"workflows": [waits], "activities": [blocks, blocks_async]}
    engine = dex.Engine(adapter_factory(), **kinds, poll_interval=0.01)  # type: ignore[arg-type]
    engine.start()
    run_id = engine.start_workflow(waits, 4, is_async)
    assert STARTED.wait(10), "the activity never started"

    began = time.monotonic()
    engine.stop(timeout=1)
    took = time.monotonic() - began
    assert took < 2.5, f"stop(timeout=1) took {took:.1f} s"

    RELEASE.set()  # the abandoned attempt ends now, after the stop: it must write nothing
    assert ENDED.wait(5)
    time.sleep(0.1)  # let its thread hand its outcome to the (stopped) engine's buffer
    assert len(engine.buffer) == 0
    if not is_async:
        assert heartbeats_after_stop == [False]  # its lease is not kept alive by a stopped engine

    successor = dex.Engine(adapter_factory(), **kinds)  # type: ignore[arg-type]
    successor.drain(advance_time=False)
    assert successor.get_run(run_id).status is dex.RunStatus.RUNNING  # the lease still holds
    assert "ActivityTaskCompleted" not in [e.kind for e in successor.history(run_id)]
    successor.drain()  # the clock jumps to the lease's end: the task runs again here
    assert successor.wait(run_id, timeout=1) == 40
    assert attempts == [1, 2]

    healthy = successor.start_workflow(waits, 5, is_async)  # attempt 1 again, released at once
    successor.drain()
    assert successor.wait(healthy, timeout=1) == 50


def test_stop_still_lets_short_attempts_finish_and_writes_their_outcomes(
    adapter_factory: Any, released: None
) -> None:
    RELEASE.set()  # the first attempt ends at once
    engine = dex.Engine(adapter_factory(), workflows=[waits], activities=[blocks], poll_interval=0.01)
    engine.start()
    run_id = engine.start_workflow(waits, 6, False)
    assert ENDED.wait(10)
    engine.stop(timeout=5)
    assert len(engine.buffer) == 0
    successor = dex.Engine(adapter_factory(), workflows=[waits], activities=[blocks])
    successor.drain(advance_time=False)  # no lease to wait for: the outcome was written
    assert successor.wait(run_id, timeout=1) == 60
    assert attempts == [1]
