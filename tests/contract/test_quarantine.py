"""Workflow code beyond the watchdog's reach is quarantined in its process, on
every adapter.

Code that swallows the watchdog's interrupt spins on in its thread; C code that holds the GIL
freezes the whole process, the watchdog included. Retried on the same process, either would do
it again, for ever: such a workflow is no longer run by that process (dex.app.machinery.quarantine). Its
tasks are given back, never lost: another process runs them; and the other workflows of the
process go on.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.observability.prometheus import PrometheusTelemetry
from dex.testing import VirtualClock

spin = {"on": True}
regex = {"on": True, "length": 24}


@dex.workflow
async def swallower(ctx: dex.WorkflowContext) -> str:
    while True:
        try:
            while spin["on"]:  # swallows the watchdog's interrupt, and spins on
                pass
            return "stopped"
        except BaseException:  # noqa: BLE001 - hostile on purpose
            pass


@dex.workflow
async def backtracks(ctx: dex.WorkflowContext) -> str:
    if regex["on"]:  # re never releases the GIL: nothing else of the process runs meanwhile
        re.match(r"(a+)+$", "a" * regex["length"] + "b")
    return "matched"


@dex.activity
def quick(x: int) -> int:
    return x + 1


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(quick, x)  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    spin["on"] = True
    regex["on"] = True
    yield
    spin["on"] = False  # whatever still spins leaves
    regex["on"] = False


def _eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("not within the time")


def _blocks(caplog: pytest.LogCaptureFixture, run_id: str) -> int:
    """How many times the watchdog gave the run's task back, blocked."""
    return sum(
        1 for r in caplog.records if getattr(r, "run_id", None) == run_id and "blocked the task" in r.getMessage()
    )


def _workflow_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "dex-workflow-worker")


def _started(make_engine: Any, metrics: PrometheusTelemetry) -> dex.Engine:
    engine: dex.Engine = make_engine(
        [swallower, backtracks, healthy], [quick], poll_interval=0.01, workflow_task_deadline=0.5
    )
    engine.telemetry.attach(metrics)
    engine.start()
    return engine


def test_code_that_swallows_the_interrupt_is_quarantined_and_its_threads_stay_bounded(
    make_engine: Any, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    metrics = PrometheusTelemetry()
    engine = _started(make_engine, metrics)
    threads_before = _workflow_threads()
    hostile = engine.start_workflow(swallower)

    # each retry blocks again and leaves a thread spinning past its interrupt; two of them, and
    # the workflow is no longer run here
    def blocked_again(seen: int) -> int:
        return _blocks(caplog, hostile) if _blocks(caplog, hostile) > seen else 0

    def spinning_on(blocks: int) -> bool:  # each blocked thread spins on past its interrupt
        health = engine.health()
        return health.interrupted_threads >= blocks or bool(health.quarantined_workflows)

    blocks = 0
    while not engine.health().quarantined_workflows:
        blocks = _eventually(functools.partial(blocked_again, blocks))
        assert blocks <= 3
        _eventually(functools.partial(spinning_on, blocks))
        # the task's backoff: it is claimed again (only once given back: the jump would end its lease)
        clock.advance(timedelta(seconds=30))
    health = engine.health()
    assert health.quarantined_workflows == ("swallower",)
    assert not health.ok
    _eventually(lambda: any("quarantined" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records))
    spinning = _blocks(caplog, hostile)

    # more retries come due, but no more threads: the run's task is not claimed here any more
    for x in range(3):
        clock.advance(timedelta(minutes=10))
        assert engine.wait(engine.start_workflow(healthy, x), timeout=10) == x + 1
    assert _blocks(caplog, hostile) == spinning
    # (a healthy task slowed down by the spinning threads may have its thread replaced for a while)
    _eventually(lambda: _workflow_threads() <= threads_before + spinning)
    assert 1 <= engine.health().interrupted_threads <= spinning
    assert metrics.registry.get_sample_value("dex_interrupted_threads") == engine.health().interrupted_threads
    assert metrics.registry.get_sample_value("dex_workflow_quarantined", {"workflow": "swallower"}) == 1
    assert engine.health().threads_alive
    assert not engine.get_run(hostile).status.is_terminal

    # the spinning code lets go: its threads leave, and are no longer counted
    spin["on"] = False
    _eventually(lambda: engine.health().interrupted_threads == 0)
    # the task was left, not lost: another process (engine) runs it
    other = make_engine([swallower], [], poll_interval=0.01)
    other.start()
    clock.advance(timedelta(minutes=10))
    assert other.wait(hostile, timeout=10) == "stopped"
    assert engine.health().quarantined_workflows == ("swallower",)  # for as long as the process lives


def _regex_length(seconds: float) -> int:
    """A subject that keeps ``(a+)+$`` backtracking about ``seconds`` on this host (doubling per 'a')."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        re.match(r"(a+)+$", "a" * 18 + "b")
        times.append(time.perf_counter() - started)
    took = max(sorted(times)[1], 1e-4)
    return min(30, 18 + math.ceil(math.log2(seconds / took)))


def test_code_that_holds_the_gil_past_the_deadline_is_quarantined_at_once(
    make_engine: Any, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex")
    regex["length"] = _regex_length(1.5)  # three deadlines: the watchdog cannot run meanwhile
    metrics = PrometheusTelemetry()
    engine = _started(make_engine, metrics)
    first = engine.start_workflow(backtracks)

    _eventually(lambda: engine.health().quarantined_workflows)
    assert engine.health().quarantined_workflows == ("backtracks",)
    assert any("held the GIL" in r.getMessage() for r in caplog.records)
    assert metrics.registry.get_sample_value("dex_workflow_quarantined", {"workflow": "backtracks"}) == 1

    # no task of it runs here again (a frozen process each time); the rest goes on
    second = engine.start_workflow(backtracks)
    for x in range(2):
        clock.advance(timedelta(minutes=10))
        assert engine.wait(engine.start_workflow(healthy, x), timeout=10) == x + 1
    assert not engine.get_run(second).status.is_terminal
    assert "WorkflowTaskStarted" not in [event.kind for event in engine.history(second)]

    # left, not lost: another process runs them (the code no longer backtracks there)
    regex["on"] = False
    other = make_engine([backtracks], [], poll_interval=0.01)
    other.start()
    clock.advance(timedelta(minutes=10))
    assert other.wait(second, timeout=10) == "matched"
    assert other.wait(first, timeout=10) == "matched"
