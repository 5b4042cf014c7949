"""Fire times (dex.app.schedules.times) and the checks of dex.Schedule (docs/reference/contract.md §10).

The daylight-saving rules in two zones, each against croniter's own walk in UTC where no
transition interferes; whole seconds; jitter in range and deterministic; the ValueErrors of
invalid schedules name the problem.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

import dex
from dex.app.schedules.times import jitter_offset, next_cron_fire, next_every_fire, zone

BERLIN, NEW_YORK = zone("Europe/Berlin"), zone("America/New_York")


@dex.workflow
async def job(ctx: dex.WorkflowContext) -> None:
    return None


def fires(expression: str, tz_name: str, start: datetime, count: int) -> list[datetime]:
    tz, moment, out = zone(tz_name), start, []
    for _ in range(count):
        moment = next_cron_fire(expression, tz, moment)
        out.append(moment)
    return out


def local(moments: list[datetime], tz_name: str) -> list[str]:
    return [m.astimezone(zone(tz_name)).strftime("%m-%d %H:%M%z") for m in moments]


@pytest.mark.parametrize(
    ("tz_name", "day"),
    [
        ("Europe/Berlin", datetime(2026, 3, 28, 12, tzinfo=UTC)),
        ("America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC)),
    ],
)
def test_a_time_in_the_spring_gap_fires_once_when_the_gap_ends(tz_name: str, day: datetime) -> None:
    got = local(fires("30 2 * * *", tz_name, day, 3), tz_name)
    assert got[0].endswith("03:00" + got[0][-5:]) and got[0][6:11] == "03:00"
    assert [g[6:11] for g in got[1:]] == ["02:30", "02:30"]


@pytest.mark.parametrize(
    ("tz_name", "start", "gap_end_utc"),
    [
        ("Europe/Berlin", datetime(2026, 3, 29, 0, 30, tzinfo=UTC), datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
        ("America/New_York", datetime(2026, 3, 8, 6, 30, tzinfo=UTC), datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),
    ],
)
def test_several_fire_times_in_one_gap_merge_into_one_fire(
    tz_name: str, start: datetime, gap_end_utc: datetime
) -> None:
    got = fires("*/15 * * * *", tz_name, start, 4)
    # 01:45 local, then 02:00..02:45 (the gap) and 03:00 all at the gap's end, then 03:15
    assert got[1] == gap_end_utc
    assert got[2] == gap_end_utc + timedelta(minutes=15)
    assert len(set(got)) == len(got)


@pytest.mark.parametrize(
    ("tz_name", "start"),
    [
        ("Europe/Berlin", datetime(2026, 10, 24, 12, tzinfo=UTC)),
        ("America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC)),
    ],
)
def test_a_repeated_time_fires_at_its_first_occurrence_only(tz_name: str, start: datetime) -> None:
    got = fires("*/30 * * * *", tz_name, start, 60)
    walls = local(got, tz_name)
    # every wall time fires once, although the repeated hour happens twice
    assert len({w[:11] for w in walls}) == len(walls)
    assert all(b - a >= timedelta(minutes=30) for a, b in itertools.pairwise(got))
    # the repeated hour's wall times fire once each, in its first pass (summer time's offset)
    day, hour, summer = ("10-25", "02", "+0200") if tz_name == "Europe/Berlin" else ("11-01", "01", "-0400")
    repeated = [w for w in walls if w.startswith(f"{day} {hour}:")]
    assert repeated == [f"{day} {hour}:00{summer}", f"{day} {hour}:30{summer}"]


@settings(max_examples=60, deadline=None)
@given(
    minute=st.sampled_from(["*", "*/7", "0", "5,35", "10-20"]),
    hour=st.sampled_from(["*", "3", "*/5", "9-17"]),
    dow=st.sampled_from(["*", "1-5", "0"]),
    start=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1)),
)
def test_in_utc_the_fires_are_croniters(minute: str, hour: str, dow: str, start: datetime) -> None:
    expression = f"{minute} {hour} * * {dow}"
    walk = croniter(expression, start)
    expected = [walk.get_next(datetime).replace(tzinfo=UTC) for _ in range(5)]
    assert fires(expression, "UTC", start.replace(tzinfo=UTC), 5) == expected


def test_six_fields_put_seconds_first() -> None:
    got = fires("*/20 * * * * *", "UTC", datetime(2026, 1, 1, tzinfo=UTC), 3)
    assert [m.second for m in got] == [20, 40, 0]


@settings(max_examples=50, deadline=None)
@given(
    every=st.integers(1, 10_000),
    offset=st.integers(-100_000, 100_000),
)
def test_every_fires_on_its_grid_strictly_after(every: int, offset: int) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    after = start + timedelta(seconds=offset, microseconds=offset % 7)
    fire = next_every_fire(start, timedelta(seconds=every), after)
    assert fire > after or (after < start and fire == start)
    assert (fire - start) % timedelta(seconds=every) == timedelta(0)
    assert fire - timedelta(seconds=every) <= after or fire == start


def test_jitter_is_deterministic_and_in_range() -> None:
    fire = datetime(2026, 1, 1, tzinfo=UTC)
    jitter = timedelta(minutes=5)
    offsets = {jitter_offset("a", fire + timedelta(minutes=i), jitter) for i in range(50)}
    assert all(timedelta(0) <= o < jitter for o in offsets) and len(offsets) > 40
    assert jitter_offset("a", fire, jitter) == jitter_offset("a", fire, jitter)
    assert jitter_offset("a", fire, timedelta(0)) == timedelta(0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "4 fields"),
        ({"cron": "0 0 30 2 *"}, "cron expression"),
        ({"cron": "@daily"}, "1 fields"),
        ({"cron": "0 0 1 1 * * 2030"}, "7 fields"),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "exactly one"),
        ({}, "exactly one"),
        ({"every": timedelta(milliseconds=1500)}, "whole number"),
        ({"every": timedelta(0)}, "every"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "Europe/Ber\x00lin"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "Europe/\udcffBerlin"}, "timezone"),
        ({"cron": "* * * * *", "overlap": "queue"}, "overlap"),
        ({"cron": "* * * * *", "jitter": timedelta(seconds=-1)}, "jitter"),
        ({"cron": "* * * * *", "catchup_window": 5}, "catchup_window"),
        ({"cron": "* * * * *", "start_at": datetime(2026, 1, 1)}, "start_at"),
        ({"cron": "* * * * *", "labels": {"k": "v\x00"}}, "NUL"),
        ({"cron": "* * * * *", "labels": {"k\udcff": "v"}}, "labels"),
        ({"cron": "* * * * *", "labels": {"dex.schedule": "x"}}, "dex.schedule"),
        ({"cron": "* * * * *", "queue": "Bad Queue"}, "queue"),
        ({"cron": "* * * * *", "priority": 101}, "priority"),
        (
            {
                "cron": "* * * * *",
                "start_at": datetime(2026, 2, 1, tzinfo=UTC),
                "end_at": datetime(2026, 1, 1, tzinfo=UTC),
            },
            "before",
        ),
    ],
)
def test_an_invalid_schedule_is_refused_naming_the_problem(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        dex.Schedule("s", job, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a b", "n\x00", "n\udcff", "x" * 129, 5])
def test_an_invalid_name_is_refused(name: object) -> None:
    with pytest.raises(ValueError, match="schedule name"):
        dex.Schedule(name, job, cron="* * * * *")  # type: ignore[arg-type]


def test_a_workflow_that_is_not_one_is_refused() -> None:
    async def plain(ctx: object) -> None:
        return None

    with pytest.raises(ValueError, match="workflow"):
        dex.Schedule("s", plain, cron="* * * * *")
    assert dex.Schedule("s", "job", every=timedelta(seconds=1)).workflow_name == "job"
