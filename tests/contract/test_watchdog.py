"""Workflow code that blocks its task past the deadline (docs/reference/contract.md §8), on every adapter.

The task fails — not the run — with a log line naming the run and the line the code blocked
at; it is retried with backoff, and other runs go on meanwhile (dex.app.machinery.watchdog).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock

blocking = {"sleep": True, "spin": True}
woke: list[float] = []  # the blocked sleeper's code came back from its sleep
left_loop: list[bool] = []  # the spinner's code left its loop (ctx.is_replaying then)


@dex.workflow
async def sleeper(ctx: dex.WorkflowContext) -> str:
    if blocking["sleep"]:
        time.sleep(3)  # blocks here (sleep)
        woke.append(time.monotonic())
    return "slept"


@dex.workflow
async def spinner(ctx: dex.WorkflowContext) -> str:
    try:
        while blocking["spin"]:  # blocks here (spin)
            pass
    finally:
        left_loop.append(ctx.is_replaying)
    return "spun"


@dex.activity
def quick(x: int) -> int:
    return x + 1


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(quick, x)  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _reset() -> None:
    blocking.update(sleep=True, spin=True)
    woke.clear()
    left_loop.clear()


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if text.endswith(marker))


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("not within the time")


def _given_back(caplog: pytest.LogCaptureFixture, run_id: str) -> logging.LogRecord:
    def find() -> logging.LogRecord | None:
        for record in caplog.records:
            if getattr(record, "run_id", None) == run_id and "blocked" in record.getMessage():
                return record
        return None

    return _eventually(find)  # type: ignore[no-any-return]


def _started(make_engine: Any) -> dex.Engine:
    engine: dex.Engine = make_engine(
        [sleeper, spinner, healthy], [quick], poll_interval=0.01, workflow_task_deadline=0.5
    )
    engine.start()
    return engine


def _workflow_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dex-workflow-worker"]


@pytest.mark.parametrize("workflow", ["sleeper", "spinner"])
def test_code_that_blocks_its_task_fails_the_task_and_others_go_on(
    make_engine: Any, clock: VirtualClock, caplog: pytest.LogCaptureFixture, workflow: str
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    engine = _started(make_engine)
    threads_before = len(_workflow_threads())
    blocked = engine.start_workflow(sleeper if workflow == "sleeper" else spinner)

    record = _given_back(caplog, blocked)
    message = record.getMessage()
    assert blocked in message
    marker = "# blocks here " + ("(sleep)" if workflow == "sleeper" else "(spin)")
    assert f"test_watchdog.py:{_line(marker)}" in message

    ok = engine.start_workflow(healthy, 1)
    assert engine.wait(ok, timeout=10) == 2
    if workflow == "sleeper":
        assert woke == []  # the healthy run finished while the blocked code still slept
    else:
        assert _eventually(lambda: left_loop) == [True]  # the loop was interrupted, replay-silent
        _eventually(lambda: len(_workflow_threads()) <= threads_before)  # the blocked thread left
    assert engine.health().threads_alive
    assert not engine.get_run(blocked).status.is_terminal  # the task failed, not the run

    # the task comes back after its backoff; the code no longer blocks, and the run completes
    blocking.update(sleep=False, spin=False)
    clock.advance(timedelta(seconds=10))
    assert engine.wait(blocked, timeout=10) == ("slept" if workflow == "sleeper" else "spun")
    assert "RunCompleted" in [event.kind for event in engine.history(blocked)]
    assert engine.get_run(blocked).failure is None


def test_a_task_that_blocks_again_is_given_back_again_with_a_longer_backoff(
    make_engine: Any, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    engine = _started(make_engine)
    blocked = engine.start_workflow(spinner)
    _given_back(caplog, blocked)
    caplog.clear()
    clock.advance(timedelta(seconds=10))  # claimed again: still spins, given back again
    second = _given_back(caplog, blocked).getMessage()
    assert "retried in" in second
    assert not engine.get_run(blocked).status.is_terminal
    blocking["spin"] = False
    clock.advance(timedelta(seconds=30))
    assert engine.wait(blocked, timeout=10) == "spun"


def test_the_rest_of_a_blocked_round_goes_on_in_a_fresh_thread(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    engine: dex.Engine = make_engine(
        [sleeper, spinner, healthy], [quick], poll_interval=0.01, workflow_task_deadline=0.5
    )
    # created before the start: the first round claims both, the blocking one first (priority)
    blocked = engine.start_workflow(sleeper, priority=100)
    ok = engine.start_workflow(healthy, 1)
    claimed: list[list[str]] = []
    claim = engine.store.claim_workflow_tasks

    def recording(*args: Any, **kwargs: Any) -> Any:
        tasks = claim(*args, **kwargs)
        if tasks:
            claimed.append([task.run_id for task in tasks])
        return tasks

    engine.store.claim_workflow_tasks = recording  # type: ignore[method-assign]
    engine.start()
    assert engine.wait(ok, timeout=10) == 2
    assert woke == []  # while the blocked code still slept
    assert claimed[0] == [blocked, ok]  # one round held both
    _given_back(caplog, blocked)


def test_a_stalled_task_no_longer_holds_up_its_round_and_is_written_if_it_ends_in_time(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    # a deadline well past the sleep: the sleeper's task is slow, not blocked
    engine: dex.Engine = make_engine(
        [sleeper, healthy],
        [quick],
        poll_interval=0.01,
        workflow_task_deadline=20,
        workflow_task_lease=timedelta(seconds=60),
    )
    slow = engine.start_workflow(sleeper, priority=100)
    ok = engine.start_workflow(healthy, 1)
    engine.start()
    # the healthy run of the same round goes on once the sleeper has stalled for a second
    assert engine.wait(ok, timeout=2.5) == 2
    assert woke == []
    # the slow task ends before its deadline: written as usual, nothing given back
    assert engine.wait(slow, timeout=10) == "slept"
    assert not [r for r in caplog.records if "blocked" in r.getMessage()]
    assert engine.health().threads_alive


def test_the_deadline_is_at_most_half_the_workflow_task_lease(make_engine: Any) -> None:
    engine: dex.Engine = make_engine([healthy], [quick], workflow_task_lease=timedelta(seconds=4))
    engine.start()
    started = engine.runtime.started
    watchdog = started.watchdog if started is not None else None
    assert watchdog is not None and watchdog.deadline == 2.0 and watchdog.stall == 0.5
