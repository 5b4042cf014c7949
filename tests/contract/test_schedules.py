"""Schedules through the engine (docs/reference/contract.md §10), on both adapters, with the virtual clock.

Fires start one run each with the instance id, label and ``ctx.scheduled_at`` docs/reference/contract.md §10
names; daylight saving in two zones; jitter; every overlap policy; catch-up; pause (and its
surviving a redeploy), resume, trigger, backfill, update, delete; ``drain(until=)``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dex
from dex.app.schedules.times import zone
from dex.testing import VirtualClock

T0 = datetime(2026, 3, 27, 12, tzinfo=UTC)
SEEN: list[tuple[str, datetime | None, Any]] = []


@dex.workflow
async def report(ctx: dex.WorkflowContext, value: int = 0) -> str | None:
    SEEN.append((ctx.instance_id or "", ctx.scheduled_at, value))
    return ctx.scheduled_at.isoformat() if ctx.scheduled_at is not None else None


@dex.workflow
async def slow(ctx: dex.WorkflowContext) -> None:
    await ctx.sleep(timedelta(minutes=25))


@pytest.fixture(autouse=True)
def _at_t0(clock: VirtualClock) -> None:
    clock.advance_to(T0)
    SEEN.clear()


Make = Callable[..., dex.Engine]


def fire_times(engine: dex.Engine, name: str) -> list[datetime]:
    runs = engine.list_runs(labels={"dex.schedule": name}, limit=1000)
    return sorted(
        datetime.strptime(r.instance_id[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for r in runs if r.instance_id
    )


def test_a_fire_starts_one_run_with_its_instance_id_label_and_scheduled_at(
    make_engine: Make, clock: VirtualClock
) -> None:
    nightly = dex.Schedule("nightly-report", report, cron="0 3 * * *", timezone="Europe/Berlin", args=(5,))
    engine = make_engine([report], schedules=[nightly])
    info = engine.get_schedule("nightly-report")
    assert info.next_fire_at == datetime(2026, 3, 28, 2, 0, tzinfo=UTC)  # 03:00 CET
    engine.drain(until=datetime(2026, 3, 28, 2, 0, tzinfo=UTC))
    (run,) = engine.list_runs()
    assert run.instance_id == "schedule:nightly-report:2026-03-28T02:00:00Z"
    assert run.labels == {"dex.schedule": "nightly-report"}
    assert run.scheduled_at == datetime(2026, 3, 28, 2, 0, tzinfo=UTC)  # RunInfo too (docs/reference/contract.md §11)
    assert engine.wait(run.run_id) == "2026-03-28T02:00:00+00:00"
    assert SEEN == [(run.instance_id, datetime(2026, 3, 28, 2, 0, tzinfo=UTC), 5)]
    info = engine.get_schedule("nightly-report")
    assert (info.last_fire_at, info.last_run_id) == (datetime(2026, 3, 28, 2, 0, tzinfo=UTC), run.run_id)
    assert clock.now() == datetime(2026, 3, 28, 2, 0, tzinfo=UTC)


def test_runs_no_schedule_started_have_no_scheduled_at(make_engine: Make) -> None:
    engine = make_engine([report])
    run_id = engine.start_workflow(report, instance_id="schedule:x:2026-01-01T00:00:00Z")
    engine.drain()
    assert engine.wait(run_id) is None
    assert engine.get_run(run_id).scheduled_at is None


def test_drain_without_until_starts_only_what_is_due_and_ends(make_engine: Make, clock: VirtualClock) -> None:
    schedule = dex.Schedule("q", report, every=timedelta(minutes=1), overlap="allow_all")
    engine = make_engine([report], schedules=[schedule])
    engine.drain()
    assert engine.list_runs() == [] and clock.now() == T0
    clock.advance(timedelta(minutes=3))
    engine.drain()  # due now: the fire at +3 min; the two before it as catch-up (younger than an hour)
    assert fire_times(engine, "q") == [T0 + timedelta(minutes=m) for m in (1, 2, 3)]


@pytest.mark.parametrize(
    ("tz_name", "spring", "fall"),
    [
        ("Europe/Berlin", datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 10, 25, tzinfo=UTC)),
        ("America/New_York", datetime(2027, 3, 14, 5, tzinfo=UTC), datetime(2027, 11, 7, 4, tzinfo=UTC)),
    ],
)
def test_daylight_saving_in_two_zones(
    make_engine: Make, clock: VirtualClock, tz_name: str, spring: datetime, fall: datetime
) -> None:
    clock.advance_to(spring - timedelta(hours=1))
    engine = make_engine([report], schedules=[dex.Schedule("dst", report, cron="30 2 * * *", timezone=tz_name)])
    engine.drain(until=spring + timedelta(days=2))
    walls = [t.astimezone(zone(tz_name)).strftime("%d %H:%M") for t in fire_times(engine, "dst")]
    assert walls == [f"{spring.day:02d} 03:00", f"{spring.day + 1:02d} 02:30"]  # the gap's fire at its end
    every15 = dex.Schedule("q", report, cron="*/15 * * * *", timezone=tz_name)
    clock.advance_to(fall)
    engine.create_schedule(every15)
    engine.drain(until=fall + timedelta(hours=6))
    got = fire_times(engine, "q")
    walls = [t.astimezone(zone(tz_name)).strftime("%H:%M") for t in got]
    assert len(walls) == len(set(walls))  # the repeated hour's second pass fires nothing
    assert len(got) == 6 * 4 - 4  # six hours of real time: four fires fewer


def test_jitter_delays_each_fire_within_its_bound_deterministically(make_engine: Make, clock: VirtualClock) -> None:
    schedule = dex.Schedule("j", report, every=timedelta(minutes=15), jitter=timedelta(minutes=10))
    engine = make_engine([report], schedules=[schedule])
    engine.drain(until=timedelta(hours=2))
    runs = engine.list_runs(limit=100)
    assert len(runs) in (7, 8)  # the last fire's jitter may carry it past the bound
    for run in runs:
        fire = datetime.strptime(run.instance_id[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)  # type: ignore[index]
        assert fire <= run.created_at < fire + timedelta(minutes=10)
    assert len({run.created_at - datetime.strptime(run.instance_id[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for run in runs}) > 1  # type: ignore[index]  # fmt: skip


@pytest.mark.parametrize(
    ("overlap", "expected"),
    [
        # a run lasts 25 minutes; fires every 10 minutes for an hour (at 10, 20, ..., 60)
        ("allow_all", [10, 20, 30, 40, 50, 60]),
        ("skip", [10, 40]),  # 20, 30 dropped while the first runs; 50, 60 while the second
        # 20 kept (30 dropped) and started at 35, when the first run ends; 40 kept (50 dropped)
        # and started at 60; 60 kept
        ("buffer_one", [10, 20, 40]),
        ("cancel_other", [10, 20, 30, 40, 50, 60]),
    ],
)
def test_every_overlap_policy(make_engine: Make, clock: VirtualClock, overlap: str, expected: list[int]) -> None:
    schedule = dex.Schedule("o", slow, every=timedelta(minutes=10), overlap=overlap)
    engine = make_engine([slow], schedules=[schedule])
    engine.drain(until=timedelta(minutes=60, seconds=30))
    got = [int((t - T0).total_seconds() // 60) for t in fire_times(engine, "o")]
    assert got == expected
    statuses = [run.status for run in engine.list_runs(limit=100)]
    if overlap == "cancel_other":
        assert statuses.count(dex.RunStatus.CANCELLED) == len(expected) - 1


def test_a_suspended_run_counts_as_live(make_engine: Make, clock: VirtualClock) -> None:
    engine = make_engine([slow], schedules=[dex.Schedule("s", slow, every=timedelta(minutes=10))])
    engine.drain(until=timedelta(minutes=10))
    (first,) = engine.list_runs()
    engine.suspend(first.run_id)
    engine.drain(until=timedelta(minutes=45))  # its timer is held back: it stays live
    assert [(r.run_id, r.status) for r in engine.list_runs()] == [(first.run_id, dex.RunStatus.SUSPENDED)]
    engine.resume(first.run_id)
    engine.drain(until=timedelta(minutes=10))
    assert len(engine.list_runs()) == 2


def test_fires_missed_while_down_catch_up_within_the_window_oldest_first(
    make_engine: Make, clock: VirtualClock
) -> None:
    schedule = dex.Schedule(
        "c", report, every=timedelta(minutes=10), catchup_window=timedelta(minutes=35), overlap="allow_all"
    )
    engine = make_engine([report], schedules=[schedule])
    clock.advance(timedelta(hours=2))  # no engine ran: twelve fires missed
    engine.drain()
    # younger than 35 minutes (strictly): 1:30, 1:40, 1:50, 2:00; the rest skipped
    assert fire_times(engine, "c") == [T0 + timedelta(minutes=m) for m in (90, 100, 110, 120)]
    created = [r.created_at for r in sorted(engine.list_runs(), key=lambda r: r.instance_id or "")]
    assert created == sorted(created)


def test_pause_survives_a_redeploy_and_resume_skips_what_was_due(make_engine: Make, clock: VirtualClock) -> None:
    declared = dex.Schedule("p", report, every=timedelta(minutes=10))
    engine = make_engine([report], schedules=[declared])
    engine.pause_schedule("p", note="db migration")
    engine.drain(until=timedelta(minutes=30))
    assert engine.list_runs() == []
    again = make_engine([report], schedules=[declared])  # a redeploy declares it anew
    info = again.get_schedule("p")
    assert info.paused and info.note == "db migration"
    again.resume_schedule("p")
    again.drain(until=timedelta(minutes=20))
    assert fire_times(again, "p") == [T0 + timedelta(minutes=40), T0 + timedelta(minutes=50)]
    assert not again.get_schedule("p").paused


def test_a_declared_paused_applies_at_creation_only(make_engine: Make) -> None:
    engine = make_engine([report], schedules=[dex.Schedule("dp", report, every=timedelta(minutes=1), paused=True)])
    assert engine.get_schedule("dp").paused
    engine.resume_schedule("dp")
    again = make_engine([report], schedules=[dex.Schedule("dp", report, every=timedelta(minutes=1), paused=True)])
    assert not again.get_schedule("dp").paused


def test_trigger_ignores_pause_and_backfill_fills_the_gaps(make_engine: Make, clock: VirtualClock) -> None:
    engine = make_engine([report], schedules=[dex.Schedule("t", report, cron="0 * * * *", args=(3,))])
    engine.pause_schedule("t")
    clock.advance(timedelta(hours=5, minutes=30))
    run_id = engine.trigger_schedule("t")
    engine.drain()
    now = clock.now().replace(microsecond=0)
    assert engine.wait(run_id) == now.isoformat()
    assert engine.get_run(run_id).instance_id == f"schedule:t:trigger:{now:%Y-%m-%dT%H:%M:%SZ}"
    assert engine.get_schedule("t").last_run_id == run_id
    ids = engine.backfill_schedule("t", T0, T0 + timedelta(hours=3))
    assert [engine.get_run(i).instance_id for i in ids] == [
        f"schedule:t:{T0 + timedelta(hours=h):%Y-%m-%dT%H:%M:%SZ}" for h in range(3)
    ]
    assert engine.backfill_schedule("t", T0, T0 + timedelta(hours=4)) != []  # only 15:00 is new
    assert len(engine.backfill_schedule("t", T0, T0 + timedelta(hours=4))) == 0
    with pytest.raises(ValueError, match="future"):
        engine.backfill_schedule("t", T0, clock.now() + timedelta(hours=1))


def test_update_keeps_state_delete_and_errors(make_engine: Make, clock: VirtualClock) -> None:
    engine = make_engine([report])
    engine.create_schedule(dex.Schedule("u", report, every=timedelta(minutes=10)))
    with pytest.raises(dex.InvalidStateError):
        engine.create_schedule(dex.Schedule("u", report, every=timedelta(minutes=10)))
    engine.pause_schedule("u", note="n")
    engine.update_schedule(dex.Schedule("u", report, cron="0 * * * *", overlap="allow_all"))
    info = engine.get_schedule("u")
    assert info.paused and info.note == "n" and info.cron == "0 * * * *" and info.overlap == "allow_all"
    assert [i.name for i in engine.list_schedules()] == ["u"]
    engine.delete_schedule("u")
    for call in (
        engine.get_schedule,
        engine.delete_schedule,
        engine.pause_schedule,
        engine.resume_schedule,
        engine.trigger_schedule,
    ):
        with pytest.raises(dex.NotFoundError):
            call("u")
    with pytest.raises(dex.NotFoundError):
        engine.update_schedule(dex.Schedule("u", report, every=timedelta(minutes=10)))


def test_engine_refuses_duplicate_and_unregistered_schedules(make_engine: Make) -> None:
    with pytest.raises(ValueError, match="two schedules"):
        make_engine([report], schedules=[dex.Schedule("d", report, every=timedelta(minutes=1))] * 2)
    with pytest.raises(dex.NotRegisteredError):
        make_engine([report], schedules=[dex.Schedule("d", slow, every=timedelta(minutes=1))])
    with pytest.raises(TypeError, match=r"argument|positional"):
        make_engine([report], schedules=[dex.Schedule("d", report, every=timedelta(minutes=1), args=(1, 2, 3))])


def test_start_and_end_are_inclusive(make_engine: Make) -> None:
    schedule = dex.Schedule(
        "w", report, every=timedelta(minutes=10), start_at=T0 + timedelta(minutes=5), end_at=T0 + timedelta(minutes=25)
    )
    engine = make_engine([report], schedules=[schedule])
    engine.drain(until=timedelta(hours=1))
    assert fire_times(engine, "w") == [T0 + timedelta(minutes=m) for m in (5, 15, 25)]
    assert engine.get_schedule("w").next_fire_at is None


def test_a_jitter_longer_than_the_catchup_window_still_fires(make_engine: Make, clock: VirtualClock) -> None:
    schedule = dex.Schedule(
        "jw", report, every=timedelta(minutes=30), jitter=timedelta(minutes=20), catchup_window=timedelta(seconds=1)
    )
    engine = make_engine([report], schedules=[schedule])
    engine.drain(until=timedelta(hours=3, minutes=30))
    assert fire_times(engine, "jw") == [T0 + timedelta(minutes=30 * k) for k in range(1, 7)]
