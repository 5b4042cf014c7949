"""``engine.stop(timeout)`` returns in time (docs/reference/contract.md §8), on every adapter.

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


def test_stop_still_lets_short_attempts_finish_and_writes_their_outcomes(adapter_factory: Any, released: None) -> None:
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


EXITS_AFTER_STOP = r"""
import threading, time
import dex
from dex.adapters.memory import InMemoryAdapter

STARTED = threading.Event()

@dex.activity(name="sleeps")
def sleeps(x: int) -> int:
    STARTED.set()
    time.sleep(30)
    return x

@dex.activity(name="quick")
def quick(x: int) -> int:
    return x * 2

@dex.workflow(name="sleeper")
async def sleeper(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(sleeps, x)

@dex.workflow(name="healthy")
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(quick, x)

def main() -> None:
    adapter = InMemoryAdapter()
    engine = dex.Engine(adapter, workflows=[sleeper], activities=[sleeps], poll_interval=0.01)
    engine.start()
    engine.start_workflow(sleeper, 1)
    assert STARTED.wait(10), "the activity never started"
    began = time.monotonic()
    engine.stop(timeout=1)
    print(f"stopped in {time.monotonic() - began:.2f}", flush=True)
    fresh = dex.Engine(adapter, workflows=[healthy], activities=[quick], poll_interval=0.01)
    fresh.start()
    print("healthy", fresh.wait(fresh.start_workflow(healthy, 21), timeout=10), flush=True)
    fresh.stop(timeout=1)
    print(f"returning at {time.time()}", flush=True)

main()
"""


def test_a_process_exits_promptly_after_stop_abandoned_a_running_attempt(tmp_path: Any) -> None:
    """A plain program that stops its engine and returns is not held up by the abandoned
    attempt's thread (the interpreter joins a ThreadPoolExecutor's threads at exit)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "exits.py"
    script.write_text(EXITS_AFTER_STOP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit after engine.stop(timeout=1): {exc.stdout!r} {exc.stderr!r}")
    exited = time.time()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert float(lines[0].split()[-1]) < 2.5, lines  # stop(timeout=1) returned in time
    assert lines[1] == "healthy 42", lines  # a healthy run after the stop completes
    returned = float(lines[2].split()[-1])
    assert exited - returned < 5, f"the process took {exited - returned:.1f} s to exit after main returned"
