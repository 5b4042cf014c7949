"""Schedules whose times cannot be represented, and the leader's step that must survive them.

A ``dex.Schedule`` range-checks every field when it is made: a period (``every``, ``jitter``,
``catchup_window``) longer than a century, a ``start_at``/``end_at`` outside 1900–9000, a cron
range that does not go upwards (croniter reads ``5-4`` as every minute), a time zone IANA does
not name (``localtime`` is whatever the host says). Each is a ``ValueError`` naming it, and a
healthy schedule fires after.

A definition that slipped past those checks (stored by an older dex: here written through the
store's own ``update_schedule``) used to make the leader retry its first fire ~20 times a
second for ever, a traceback each time. Now the leader pauses it with the reason in its note,
logs that once, and the other schedules keep firing; a schedule whose store calls fail is
retried after pauses that double, and its traceback logged once per spell of failures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.schedules import ScheduleAdvance
from dex.app.schedules.runner import MAX_BACKOFF, ScheduleRunner
from dex.testing import VirtualClock

T0 = datetime(2026, 5, 4, 12, tzinfo=UTC)
Make = Callable[..., dex.Engine]


@dex.workflow(name="bounds-job")
async def job(ctx: dex.WorkflowContext) -> str:
    return "ok"


@pytest.fixture(autouse=True)
def _at_t0(clock: VirtualClock) -> None:
    clock.advance_to(T0)


def healthy_goes_on(engine: dex.Engine, name: str = "healthy") -> None:
    """A healthy schedule fires, its run and a started one complete."""
    engine.create_schedule(dex.Schedule(name, job, every=timedelta(minutes=1)))
    run_id = engine.start_workflow(job)
    engine.drain(until=timedelta(minutes=1))
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    fired = engine.list_runs(labels={"dex.schedule": name})
    assert fired and all(run.status is dex.RunStatus.COMPLETED for run in fired)


OUT_OF_RANGE: list[tuple[dict[str, Any], str]] = [
    ({"every": timedelta(days=36_500_000)}, "every must be at most 36525 days"),
    ({"every": timedelta.max}, "every must be at most"),
    ({"cron": "* * * * *", "jitter": timedelta(days=40_000)}, "jitter must be at most"),
    ({"cron": "* * * * *", "catchup_window": timedelta.max}, "catchup_window must be at most"),
    ({"cron": "* * * * *", "start_at": datetime(9999, 12, 31, tzinfo=UTC)}, "start_at must lie between"),
    ({"cron": "* * * * *", "start_at": datetime(1, 1, 1, tzinfo=UTC)}, "start_at must lie between"),
    ({"cron": "* * * * *", "end_at": datetime(9999, 12, 31, 23, 59, tzinfo=UTC)}, "end_at must lie between"),
    # an offset that takes it past what a datetime holds when it is compared in UTC
    (
        {"cron": "* * * * *", "end_at": datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=23)))},
        "end_at must lie between",
    ),
    ({"every": timedelta(hours=1), "start_at": datetime(1899, 12, 31, tzinfo=UTC)}, "start_at must lie between"),
]


@pytest.mark.parametrize(("kwargs", "words"), OUT_OF_RANGE, ids=[w for _, w in OUT_OF_RANGE])
def test_a_field_out_of_range_is_refused_when_the_schedule_is_made(
    make_engine: Make, kwargs: dict[str, Any], words: str
) -> None:
    engine = make_engine([job])
    with pytest.raises(ValueError, match=words):
        dex.Schedule("s", job, **kwargs)
    healthy_goes_on(engine)


def test_the_widest_fields_allowed_still_compute_their_fires(make_engine: Make, clock: VirtualClock) -> None:
    """The bounds leave every derived time representable: the longest period from the latest
    start, the widest jitter and catch-up window, a cron whose match is years away."""
    engine = make_engine([job])
    latest = datetime(9000, 1, 1, tzinfo=UTC)
    century = timedelta(days=36525)
    engine.create_schedule(dex.Schedule("far", job, every=century, start_at=latest, jitter=century))
    engine.create_schedule(dex.Schedule("leap", job, cron="0 0 29 2 *", start_at=latest, catchup_window=century))
    assert engine.get_schedule("far").next_fire_at == latest
    leap = engine.get_schedule("leap").next_fire_at
    assert leap is not None and leap > latest and (leap.month, leap.day) == (2, 29)
    healthy_goes_on(engine)


REVERSED = [
    ("5-4 * * * *", "the range '5-4' in the minute field does not go upwards", "5-59,0-4"),
    ("1-1 * * * *", "the range '1-1' in the minute field does not go upwards", "write 1 alone"),
    ("0 22-2 * * *", "'22-2' in the hour field", "22-23,0-2"),
    ("0 0 20-10 * *", "'20-10' in the day of the month field", "20-31,1-10"),
    ("0 0 1 NOV-FEB *", "'NOV-FEB' in the month field", "NOV-12,1-FEB"),
    ("0 0 * * FRI-MON", "'FRI-MON' in the day of the week field", "FRI-6,0-MON"),
    ("10-5/2 * * * *", "'10-5/2' in the minute field", "10-59/2,0-5/2"),
    ("0 30-10 * * * *", "'30-10' in the minute field", "30-59,0-10"),  # six fields: seconds first
]


@pytest.mark.parametrize(("cron", "words", "advice"), REVERSED, ids=[c for c, _, _ in REVERSED])
def test_a_reversed_cron_range_is_refused_with_the_range_to_write(
    make_engine: Make, cron: str, words: str, advice: str
) -> None:
    engine = make_engine([job])
    with pytest.raises(ValueError, match="does not go upwards") as caught:
        dex.Schedule("s", job, cron=cron)
    assert words in str(caught.value) and advice in str(caught.value)
    assert engine.list_schedules() == []
    # ranges that go upwards fire as cron means them
    engine.create_schedule(dex.Schedule("upwards", job, cron="4-5 * * * *"))
    assert engine.get_schedule("upwards").next_fire_at == T0 + timedelta(minutes=4)
    healthy_goes_on(engine)


@pytest.mark.parametrize("name", ["localtime", "posixrules", "posix/Europe/Berlin", "right/UTC"])
def test_a_host_dependent_time_zone_is_refused(make_engine: Make, name: str) -> None:
    engine = make_engine([job])
    with pytest.raises(ValueError, match="host's own zone"):
        dex.Schedule("s", job, cron="0 3 * * *", timezone=name)
    # IANA names, links among them, are taken
    for zone_name in ("Europe/Berlin", "US/Pacific", "Etc/UTC", "EST5EDT"):
        dex.Schedule("s", job, cron="0 3 * * *", timezone=zone_name)
    with pytest.raises(ValueError, match="unknown timezone"):
        dex.Schedule("s", job, cron="0 3 * * *", timezone="Mars/Olympus_Mons")
    healthy_goes_on(engine)


def _store_bad_definition(engine: dex.Engine, name: str, **changes: Any) -> None:
    """Write ``changes`` into a stored schedule's definition through the store's own port, as an
    older dex (without today's bounds) could have stored it."""
    record = engine.store.get_schedule(name)
    assert record is not None
    engine.store.update_schedule(attrs.evolve(record.definition, **changes), record.next_fire_at, record.due_at)


@pytest.mark.parametrize(
    "changes",
    [{"every": timedelta(days=36_500_000)}, {"jitter": timedelta(days=36_500_000)}],
    ids=["every", "jitter"],
)
def test_a_stored_schedule_whose_next_fire_cannot_be_computed_is_paused_once_and_the_rest_fire(
    make_engine: Make, clock: VirtualClock, caplog: pytest.LogCaptureFixture, changes: dict[str, Any]
) -> None:
    caplog.set_level(logging.DEBUG, logger="dex.schedules")
    engine = make_engine([job])
    engine.create_schedule(dex.Schedule("broken", job, every=timedelta(minutes=1)))
    engine.create_schedule(dex.Schedule("steady", job, every=timedelta(minutes=1)))
    _store_bad_definition(engine, "broken", **changes)

    for minute in range(1, 6):  # many leader steps: the broken one must not be tried at each
        engine.drain(until=T0 + timedelta(minutes=minute))

    broken = engine.get_schedule("broken")
    assert broken.paused
    assert broken.note.startswith("paused by dex: schedule 'broken': its next fire")
    assert "cannot be computed" in broken.note
    assert len([r for r in caplog.records if "cannot be computed" in r.getMessage()]) == 1  # logged once
    assert not any(r.exc_info for r in caplog.records)  # and without a traceback
    steady = engine.list_runs(labels={"dex.schedule": "steady"})
    assert len(steady) == 5 and all(r.status is dex.RunStatus.COMPLETED for r in steady)
    # resuming it as it is says why it cannot be; mended, it fires again
    with pytest.raises(ValueError, match="cannot be computed"):
        engine.resume_schedule("broken")
    engine.update_schedule(dex.Schedule("broken", job, every=timedelta(minutes=1)))
    engine.resume_schedule("broken")
    engine.drain(until=clock.now() + timedelta(minutes=1))
    assert engine.list_runs(labels={"dex.schedule": "broken"})
    healthy_goes_on(engine)


class FailingAdvances:
    """The in-memory store, but ``advance_schedule`` of one schedule fails while ``failing``."""

    def __init__(self, store: InMemoryAdapter, name: str) -> None:
        self._store, self._name = store, name
        self.failing = True
        self.attempts = 0

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._store, attribute)

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        if advance.name == self._name:
            self.attempts += 1
            if self.failing:
                raise ConnectionError("the store is away for this one")
        return self._store.advance_schedule(advance, now)


def test_a_schedule_whose_store_calls_fail_is_retried_with_growing_pauses_not_at_every_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dex.schedules")
    clock = VirtualClock(T0)
    memory = InMemoryAdapter(clock=clock)
    engine = dex.Engine(memory, workflows=[job])
    engine.create_schedule(dex.Schedule("flaky", job, every=timedelta(seconds=1)))
    engine.create_schedule(dex.Schedule("steady", job, every=timedelta(seconds=1)))
    store = FailingAdvances(memory, "flaky")
    runner = ScheduleRunner(store, refresh=timedelta(seconds=1))  # type: ignore[arg-type]

    clock.advance(timedelta(seconds=1))
    for _ in range(50):  # the leader's loop, 50 steps in the same second
        runner.step()
    assert store.attempts == 1
    attempts_at: list[int] = []
    for _ in range(40):  # 40 seconds: tried again after 1, 2, 4, 8, 16 s
        clock.advance(timedelta(seconds=1))
        for _ in range(5):
            runner.step()
        attempts_at.append(store.attempts)
    assert attempts_at[-1] == 6, attempts_at
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "flaky" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None  # one traceback for the spell
    # the other schedule fired every second meanwhile (its first run still live: skipped)
    steady = memory.get_schedule("steady")
    assert steady is not None and steady.next_fire_at == clock.now() + timedelta(seconds=1)

    store.failing = False  # the store is back: at the next retry it catches up, and says so
    clock.advance(MAX_BACKOFF)
    for _ in range(10):  # a hundred late fires per step (each skipped: its first run is live)
        runner.step()
        clock.advance(timedelta(seconds=1))
    runner.step()
    flaky = memory.get_schedule("flaky")
    assert flaky is not None and flaky.last_fire_at is not None
    assert flaky.next_fire_at == clock.now() + timedelta(seconds=1)
    assert any("work again" in r.getMessage() for r in caplog.records)
    engine.drain()
    runs = engine.list_runs(labels={"dex.schedule": "flaky"})
    assert runs and all(r.status is dex.RunStatus.COMPLETED for r in runs)
