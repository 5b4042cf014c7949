"""Any BaseException of user code is that attempt's failure, naming its type; no engine thread
dies of it (docs/reference/contract.md §8). On every adapter, in started engines, on each path an attempt takes:
inline (in the workflow worker's thread), pooled, and ``async def`` (the worker's event loop).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import dex
from dex.domain.values import FailureInfo

ONCE = dex.RetryPolicy(max_attempts=1)  # the clock of these tests stands still: no retry would come due


class Custom(BaseException):
    """A BaseException of the user's own."""


class Unprintable(Exception):
    """An exception that cannot be described: its __str__ and __repr__ raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


RAISED: dict[str, type[BaseException]] = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
    "Custom": Custom,
    "Unprintable": Unprintable,
}
ran_on: list[str] = []  # the thread each hostile attempt ran in


@dex.activity(retry=ONCE)
def hostile(kind: str) -> int:
    ran_on.append(threading.current_thread().name)
    raise RAISED[kind]("raised by the activity")


@dex.activity(retry=ONCE)
async def hostile_async(kind: str) -> int:
    ran_on.append(threading.current_thread().name)
    raise RAISED[kind]("raised by the activity")


@dex.activity
def quick(x: int) -> int:
    return x + 1


@dex.activity
async def quick_async(x: int) -> int:
    return x * 2


@dex.workflow
async def catches(ctx: dex.WorkflowContext, kind: str, asynchronous: bool) -> str:
    try:
        await ctx.activity(hostile_async if asynchronous else hostile, kind)
    except dex.ActivityFailedError as exc:
        return exc.failure.type
    return "no failure"


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(quick, x)
    return await ctx.activity(quick_async, x)  # type: ignore[no-any-return]


@dex.workflow
async def raises(ctx: dex.WorkflowContext, kind: str) -> str:
    await ctx.activity(quick, 1)
    raise RAISED[kind]("raised by the workflow")


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran_on.clear()


def _started(make_engine: Any, path: str) -> dex.Engine:
    engine: dex.Engine = make_engine(
        [catches, healthy, raises],
        [hostile, hostile_async, quick, quick_async],
        poll_interval=0.01,
        # inline: a threshold no attempt of these activities comes near, even on a loaded
        # machine (at 5 ms, a slow first attempt once sent the rest to the pool)
        inline_activity_seconds={"pooled": 0.0, "inline": 1.0, "async": 0.005}[path],
    )
    if path == "inline":
        # an activity's first attempt in a process takes the ordinary path, to learn how long it
        # takes: known to be quick, its attempts run inline from the first
        engine.activity_worker.durations.record("hostile", 0.0)
    engine.start()
    return engine


def _assert_still_healthy(engine: dex.Engine) -> None:
    health = engine.health()
    assert {"dex-workflow-worker", "dex-activity-worker", "dex-scheduler", "dex-watchdog"} <= set(health.threads)
    assert health.ok, health
    assert engine.wait(engine.start_workflow(healthy, 1), timeout=10) == 4


@pytest.mark.parametrize("path", ["inline", "pooled", "async"])
def test_a_base_exception_of_an_activity_is_a_failed_attempt_naming_its_type(make_engine: Any, path: str) -> None:
    engine = _started(make_engine, path)
    for kind in ("KeyboardInterrupt", "SystemExit", "Custom"):
        run_id = engine.start_workflow(catches, kind, path == "async")
        assert engine.wait(run_id, timeout=10) == kind
        _assert_still_healthy(engine)
    expected = {"inline": "dex-workflow-worker", "pooled": "dex-activity", "async": "dex-async-activities"}[path]
    assert len(ran_on) == 3
    assert all(name.startswith(expected) for name in ran_on), ran_on


@pytest.mark.parametrize("path", ["inline", "pooled", "async"])
def test_an_exception_that_cannot_be_described_is_a_failed_attempt(make_engine: Any, path: str) -> None:
    engine = _started(make_engine, path)
    run_id = engine.start_workflow(catches, "Unprintable", path == "async")
    assert engine.wait(run_id, timeout=10) == "Unprintable"
    _assert_still_healthy(engine)


def test_the_worker_records_a_failure_even_when_describing_it_raises(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> FailureInfo:
        raise RuntimeError("describing failures is broken")

    monkeypatch.setattr(FailureInfo, "from_exception", refuse)
    engine = _started(make_engine, "pooled")
    run_id = engine.start_workflow(catches, "Custom", False)
    assert engine.wait(run_id, timeout=10) == "Custom"
    _assert_still_healthy(engine)


def test_a_base_exception_of_workflow_code_fails_its_run_naming_its_type(make_engine: Any) -> None:
    engine = _started(make_engine, "inline")
    for kind in ("KeyboardInterrupt", "SystemExit", "Custom"):
        run_id = engine.start_workflow(raises, kind)
        with pytest.raises(dex.WorkflowFailedError) as failed:
            engine.wait(run_id, timeout=10)
        assert failed.value.failure.type == kind
        _assert_still_healthy(engine)


def test_a_dead_engine_thread_is_logged_counted_and_replaced(
    make_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _started(make_engine, "pooled")
    died: list[str] = []

    class Sink:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

        def thread_died(self, name: str) -> None:
            died.append(name)

    engine.telemetry.attach(Sink())  # type: ignore[arg-type]
    (worker,) = [t for t in engine.runtime.threads if t.name == "dex-activity-worker"]

    broken = [SystemExit("a bug in the loop's own wait")]

    class Breaking(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if broken:
                raise broken.pop()
            return super().wait(timeout)

    worker._wait = Breaking().wait  # type: ignore[attr-defined]  # kills the thread once, outside its step
    caplog.set_level(logging.CRITICAL, logger="dex")
    worker.join(5)
    assert not worker.alive
    for _ in range(200):
        if died:
            break
        threading.Event().wait(0.02)
    assert died == ["dex-activity-worker"]
    assert any("dex-activity-worker" in r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL)
    (fresh,) = [t for t in engine.runtime.threads if t.name == "dex-activity-worker"]
    assert fresh is not worker
    _assert_still_healthy(engine)
