"""``async def`` activities in a started engine are awaited on the engine's event loop and hold
no pool thread while they wait; what follows each attempt (its outcome, the step it answers)
comes back to the pool. On every adapter: the attempts' failures, a loop that user code kills,
and a stop while attempts await, each followed by a healthy run."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest

import dex
from dex.app.activities.event_loop import AsyncRunner
from dex.app.machinery.threads import ActivityPool

ONCE = dex.RetryPolicy(max_attempts=1)  # the clock of these tests stands still: no retry would come due
GATE = threading.Event()
_counted = threading.Lock()
awaiting: list[int] = []  # the attempts of ``gated`` waiting at the gate


@dex.activity
async def gated(x: int) -> int:
    with _counted:
        awaiting.append(x)
    while not GATE.is_set():
        await asyncio.sleep(0.005)
    return x + 1


@dex.activity(retry=ONCE)
async def kills_the_loop(x: int) -> int:
    def exit_the_loop() -> None:
        raise SystemExit("raised in a callback of the loop, outside any task")

    asyncio.get_running_loop().call_soon(exit_the_loop)
    await asyncio.sleep(3600)
    return x


@dex.activity(retry=ONCE)
async def poisoned(kind: str) -> str:
    if kind == "result":
        return "a lone surrogate \ud800 and a NUL \x00"
    raise ValueError("a lone surrogate \ud800 and a NUL \x00 in the message")


@dex.activity
async def quick(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


@dex.workflow
async def through_the_gate(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(gated, x)  # type: ignore[no-any-return]


@dex.workflow
async def catches(ctx: dex.WorkflowContext, name: str, arg: Any) -> str:
    activity = {"kills_the_loop": kills_the_loop, "poisoned": poisoned}[name]
    try:
        await ctx.activity(activity, arg)
    except dex.ActivityFailedError as exc:
        return f"{exc.failure.type}: {exc.failure.message}"
    return "no failure"


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(quick, x)  # type: ignore[no-any-return]


ALL = ([through_the_gate, catches, healthy], [gated, kills_the_loop, poisoned, quick])


@pytest.fixture(autouse=True)
def _reset() -> Any:
    GATE.clear()
    awaiting.clear()
    yield
    GATE.set()  # whatever a failed test left waiting goes on


def _started(make_engine: Any, **options: Any) -> dex.Engine:
    engine: dex.Engine = make_engine(*ALL, poll_interval=0.01, inline_activity_seconds=0, **options)
    engine.start()
    return engine


def _threads_waiting_for_the_loop() -> int:
    """Threads blocked in ``AsyncRunner.run``, waiting for an async attempt to end."""
    waiting = 0
    for frame in sys._current_frames().values():
        current: Any = frame
        while current is not None:
            if current.f_code is AsyncRunner.run.__code__:
                waiting += 1
                break
            current = current.f_back
    return waiting


def _until(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def _assert_healthy(engine: dex.Engine) -> None:
    assert engine.health().threads_alive, engine.health()
    assert engine.wait(engine.start_workflow(healthy, 21), timeout=10) == 42


def test_awaiting_attempts_hold_no_thread(make_engine: Any) -> None:
    engine = _started(make_engine, activity_concurrency=8)
    run_ids = [engine.start_workflow(through_the_gate, i) for i in range(8)]
    _until(lambda: len(awaiting) == 8)
    # all eight await at once, and no thread waits for any of them (before: one pool thread
    # blocked in AsyncRunner.run per attempt, so at most activity_concurrency could await)
    assert _threads_waiting_for_the_loop() == 0
    GATE.set()
    assert [engine.wait(run_id, timeout=10) for run_id in run_ids] == [i + 1 for i in range(8)]
    _assert_healthy(engine)


def test_a_loop_that_user_code_kills_fails_its_attempts_and_a_new_loop_runs_the_next(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _started(make_engine)
    run_id = engine.start_workflow(catches, "kills_the_loop", 1)
    assert engine.wait(run_id, timeout=10) == "RuntimeError: the asyncio activity thread died while the attempt ran"
    assert "the asyncio activity thread died" in caplog.text
    _assert_healthy(engine)


@pytest.mark.parametrize("kind", ["result", "raise"])
def test_bad_text_from_an_awaited_attempt_is_its_own_failure(make_engine: Any, kind: str) -> None:
    engine = _started(make_engine)
    outcome = engine.wait(engine.start_workflow(catches, "poisoned", kind), timeout=10)
    if kind == "raise":  # the message stored faithfully, the surrogate (not UTF-8) as a visible escape
        assert outcome == "ValueError: a lone surrogate \\ud800 and a NUL \x00 in the message"
    else:  # a result PostgreSQL could not store: a clear, final failure of the attempt
        assert outcome.startswith("SerializationError: "), outcome
    _assert_healthy(engine)


def test_stop_returns_in_time_while_attempts_await(make_engine: Any) -> None:
    engine = _started(make_engine, activity_concurrency=4)
    for i in range(4):
        engine.start_workflow(through_the_gate, i)
    _until(lambda: len(awaiting) == 4)
    started = time.monotonic()
    engine.stop(timeout=0.5)
    assert time.monotonic() - started < 3
    assert engine.health().threads == {}
    GATE.set()
    again = _started(make_engine)  # the same store: the stopped engine's attempts are left to their leases
    _assert_healthy(again)
    again.stop()


def test_an_attempt_whose_rest_the_pool_refuses_is_written_and_frees_its_slot(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[object] = []
    call = ActivityPool.call

    def refusing(pool: ActivityPool, fn: Any, arg: Any, then: Any) -> None:
        if arg is True and not refused:  # the rest of an awaited attempt, to answer its run's next step
            refused.append(fn)
            raise RuntimeError("can't start new thread")
        call(pool, fn, arg, then)

    monkeypatch.setattr(ActivityPool, "call", refusing)
    engine = _started(make_engine, activity_concurrency=1)
    first = engine.start_workflow(healthy, 1)
    # its outcome is written the ordinary way, nothing lost
    assert engine.wait(first, timeout=10) == 2
    assert refused
    # one slot in all: the next attempts run only if the refused one's slot was freed
    _assert_healthy(engine)
