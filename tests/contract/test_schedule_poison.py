"""Poison and metrics of schedules (docs/reference/contract.md §8, §10), on both adapters.

Each poisoned value (NUL and lone surrogates in names, labels, time zones, notes; a name whose
``repr`` raises; arguments that cannot be encoded; a telemetry sink that raises) gets its clear
error, and a healthy schedule fires and a healthy run completes afterwards. The metrics hooks
report fires started with their lag, and skips with their reason.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock

T0 = datetime(2026, 5, 4, 12, tzinfo=UTC)
Make = Callable[..., dex.Engine]


@dex.workflow
async def job(ctx: dex.WorkflowContext, value: Any = None) -> str:
    return "ok"


@dex.workflow
async def slow(ctx: dex.WorkflowContext) -> None:
    await ctx.sleep(timedelta(minutes=25))


class Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    __str__ = __repr__


@pytest.fixture(autouse=True)
def _at_t0(clock: VirtualClock) -> None:
    clock.advance_to(T0)


def healthy_goes_on(engine: dex.Engine) -> None:
    engine.create_schedule(dex.Schedule("healthy", job, every=timedelta(minutes=1)))
    run_id = engine.start_workflow(job)
    engine.drain(until=timedelta(minutes=1))
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    (fired,) = engine.list_runs(labels={"dex.schedule": "healthy"})
    assert fired.status is dex.RunStatus.COMPLETED


BAD: list[tuple[Callable[[], Any], type[BaseException], str]] = [
    (lambda: dex.Schedule("n\x00", job, cron="* * * * *"), ValueError, "schedule name"),
    (lambda: dex.Schedule("n\udcff", job, cron="* * * * *"), ValueError, "schedule name"),
    (lambda: dex.Schedule(Hostile(), job, cron="* * * * *"), ValueError, "schedule name"),  # type: ignore[arg-type]
    (lambda: dex.Schedule("s", job, cron="* * * * *", timezone="UTC\x00"), ValueError, "timezone"),
    (lambda: dex.Schedule("s", job, cron="* * * * *", timezone="\udcff"), ValueError, "timezone"),
    (lambda: dex.Schedule("s", job, cron="* *\x00 * * *"), ValueError, "cron"),
    (lambda: dex.Schedule("s", job, cron="* * * * \udcff"), ValueError, "cron"),
    (lambda: dex.Schedule("s", job, cron="* * * * *", labels={"k\x00": "v"}), ValueError, "NUL"),
    (lambda: dex.Schedule("s", job, cron="* * * * *", labels={"k": "\udcff"}), ValueError, "labels"),
    (lambda: dex.Schedule("s", job, cron="* * * * *", labels={Hostile(): "v"}), ValueError, "labels"),
]


@pytest.mark.parametrize(("make", "error", "words"), BAD)
def test_a_poisoned_schedule_is_refused_and_the_rest_goes_on(
    make_engine: Make, make: Callable[[], Any], error: type[BaseException], words: str
) -> None:
    engine = make_engine([job])
    with pytest.raises(error, match=words):
        engine.create_schedule(make())
    assert engine.list_schedules() == []
    healthy_goes_on(engine)


def test_unencodable_arguments_and_bad_notes_are_refused(make_engine: Make) -> None:
    engine = make_engine([job])
    with pytest.raises(dex.SerializationError, match="argument 0"):
        engine.create_schedule(dex.Schedule("s", job, every=timedelta(minutes=1), args=(object(),)))
    engine.create_schedule(dex.Schedule("s", job, every=timedelta(minutes=1)))
    for note in ("a\x00b", "\udcff"):
        with pytest.raises(ValueError, match="note"):
            engine.pause_schedule("s", note=note)
    assert not engine.get_schedule("s").paused
    for name in ("n\x00", "n\udcff"):
        with pytest.raises(ValueError, match="schedule name"):
            engine.trigger_schedule(name)
    healthy_goes_on(engine)


class Sink:
    def __init__(self, hostile: bool = False) -> None:
        self.fired: list[tuple[str, float]] = []
        self.skipped: list[tuple[str, str, int]] = []
        self.hostile = hostile

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None  # the other hooks

    def schedule_fired(self, name: str, lag: float) -> None:
        self.fired.append((name, lag))
        if self.hostile:
            raise Hostile()  # type: ignore[misc]

    def schedule_skipped(self, name: str, reason: str, count: int) -> None:
        self.skipped.append((name, reason, count))
        if self.hostile:
            raise KeyError("sink bug")


@pytest.mark.parametrize("hostile", [False, True])
def test_metrics_report_fires_with_lag_and_skips_with_reason(
    make_engine: Make, clock: VirtualClock, hostile: bool
) -> None:
    engine = make_engine([slow])
    sink = Sink(hostile)
    engine.telemetry.attach(sink)  # type: ignore[arg-type]
    schedule = dex.Schedule(
        "m", slow, every=timedelta(minutes=10), jitter=timedelta(minutes=3), catchup_window=timedelta(minutes=15)
    )
    engine.create_schedule(schedule)
    engine.drain(until=timedelta(minutes=30))  # fires at 10 (runs 25 min), 20 and 30 overlap
    assert [name for name, _ in sink.fired] == ["m"]
    assert 0 <= sink.fired[0][1] < 180  # the lag: its jitter
    assert [(n, r) for n, r, _ in sink.skipped] == [("m", "overlap")] * len(sink.skipped) and sink.skipped
    clock.advance(timedelta(hours=1))  # down an hour: fires older than 15 minutes are skipped
    engine.drain()
    assert any(reason == "catchup" and count >= 4 for _, reason, count in sink.skipped)
    healthy = engine.start_workflow(slow)
    engine.drain()
    assert engine.get_run(healthy).status is dex.RunStatus.COMPLETED
