"""The contract of the ScheduleStore port (docs/reference/contract.md §10), on every backend.

Records round-trip (arguments, labels, intervals, times); names are unique; the due read
returns due and buffered rows, never paused ones, and the next due time; the compare-and-set
of ``advance_schedule`` applies once and starts its run in the same step, a stale one
changes nothing; a trigger starts a run and records it; a value PostgreSQL cannot hold is
refused as a whole.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
import pytest

from dex.app.ports.schedules import ScheduleAdvance, ScheduleDefinition, ScheduledStart, ScheduleRecord
from dex.app.ports.store import RunFilter, Store
from dex.domain.errors import InvalidStateError, NotFoundError
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import QUEUE, WF, MemoryBackend, PortContract, PostgresBackend, created, payload

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def definition(name: str = "nightly", **fields: object) -> ScheduleDefinition:
    values: dict[str, object] = {
        "name": name,
        "workflow_name": WF,
        "cron": "0 3 * * *",
        "every": None,
        "timezone": "Europe/Berlin",
        "args": (payload(1), payload("two")),
        "jitter": timedelta(seconds=90),
        "overlap": "buffer_one",
        "catchup_window": timedelta(hours=1),
        "start_at": T0,
        "end_at": None,
        "queue": QUEUE,
        "priority": 7,
        "labels": (("team", "ops"),),
    }
    values.update(fields)
    return ScheduleDefinition(**values)  # type: ignore[arg-type]


def record(name: str = "nightly", due: datetime | None = T0, **fields: object) -> ScheduleRecord:
    return ScheduleRecord(definition=definition(name, **fields), created_at=T0, next_fire_at=due, due_at=due, note="")


def fire(name: str, fire_at: datetime, run_id: str) -> ScheduledStart:
    return ScheduledStart(
        run_id=run_id,
        created=created(instance_id=f"schedule:{name}:{fire_at:%Y-%m-%dT%H:%M:%SZ}", labels=(("dex.schedule", name),)),
        fire_at=fire_at,
    )


class ScheduleStoreContract(PortContract):
    def test_a_record_round_trips_and_names_are_unique(self, store: Store) -> None:
        stored = record(every=timedelta(minutes=15), cron=None)
        store.create_schedule(stored)
        assert store.get_schedule("nightly") == stored
        with pytest.raises(InvalidStateError):
            store.create_schedule(record())
        assert store.get_schedule("other") is None
        store.create_schedule(record("alpha"))
        assert [r.name for r in store.list_schedules()] == ["alpha", "nightly"]

    def test_update_pause_and_delete_name_missing_schedules(self, store: Store) -> None:
        with pytest.raises(NotFoundError):
            store.update_schedule(definition("ghost"), None, None)
        with pytest.raises(NotFoundError):
            store.set_schedule_paused("ghost", True, "", None, None)
        with pytest.raises(NotFoundError):
            store.delete_schedule("ghost")
        with pytest.raises(NotFoundError):
            store.trigger_schedule("ghost", fire("ghost", T0, "r-ghost"), T0)

    def test_update_keeps_the_operator_state(self, store: Store) -> None:
        store.create_schedule(record())
        store.set_schedule_paused("nightly", True, "maintenance", T0, T0)
        store.update_schedule(definition(priority=9), T0 + timedelta(days=1), T0 + timedelta(days=1))
        got = store.get_schedule("nightly")
        assert got is not None and got.paused and got.note == "maintenance"
        assert got.definition.priority == 9 and got.next_fire_at == T0 + timedelta(days=1)
        store.delete_schedule("nightly")
        assert store.list_schedules() == []

    def test_the_due_read_skips_paused_rows_and_gives_the_next_due(self, store: Store, clock: VirtualClock) -> None:
        store.create_schedule(record("a", due=T0))
        store.create_schedule(record("b", due=T0 + timedelta(minutes=5)))
        store.create_schedule(record("c", due=T0 - timedelta(minutes=5)))
        store.set_schedule_paused("c", True, "", T0, T0)
        due, following = store.due_schedules(T0, 10)
        assert [r.name for r in due] == ["a"] and following == T0 + timedelta(minutes=5)
        assert store.due_schedules(T0, 0) == ([], T0 + timedelta(minutes=5))
        nothing, none = store.due_schedules(T0 - timedelta(hours=1), 10)
        assert nothing == [] and none == T0  # "c" is paused: its earlier due time does not count

    def test_a_fire_applies_once_and_starts_its_run(self, store: Store, clock: VirtualClock) -> None:
        store.create_schedule(record())
        later = T0 + timedelta(days=1)
        advance = ScheduleAdvance(
            name="nightly",
            expected_next=T0,
            expected_buffered=None,
            next_fire_at=later,
            due_at=later,
            buffered_fire_at=None,
            start=fire("nightly", T0, "run-1"),
        )
        assert store.advance_schedule(advance, clock.now()) == (True, "run-1")
        # the same compare-and-set again (a second leader, a retry after a lost answer): nothing
        again = attrs.evolve(advance, start=fire("nightly", T0, "run-2"))
        assert store.advance_schedule(again, clock.now()) == (False, None)
        assert store.get_run("run-2") is None
        got = store.get_schedule("nightly")
        assert got is not None and (got.next_fire_at, got.last_fire_at, got.last_run_id) == (later, T0, "run-1")
        run = store.get_run("run-1")
        assert run is not None and run.status is RunStatus.CREATED and run.labels == (("dex.schedule", "nightly"),)

    def test_a_skip_and_a_buffered_fire_move_the_row_without_a_run(self, store: Store, clock: VirtualClock) -> None:
        store.create_schedule(record())
        later = T0 + timedelta(days=1)
        buffered = ScheduleAdvance(
            name="nightly",
            expected_next=T0,
            expected_buffered=None,
            next_fire_at=later,
            due_at=later,
            buffered_fire_at=T0,
        )
        assert store.advance_schedule(buffered, clock.now()) == (True, None)
        due, _ = store.due_schedules(T0, 10)  # a buffered fire is read whatever its due time
        assert [(r.name, r.buffered_fire_at) for r in due] == [("nightly", T0)]
        release = ScheduleAdvance(
            name="nightly",
            expected_next=later,
            expected_buffered=T0,
            next_fire_at=later,
            due_at=later,
            buffered_fire_at=None,
            start=fire("nightly", T0, "run-b"),
        )
        assert store.advance_schedule(release, clock.now()) == (True, "run-b")
        assert store.list_runs(RunFilter()) != []

    def test_a_trigger_starts_a_run_and_records_it(self, store: Store, clock: VirtualClock) -> None:
        store.create_schedule(record())
        start = ScheduledStart(
            run_id="run-t", created=created(instance_id="schedule:nightly:trigger:2024-01-01T00:00:00Z"), fire_at=T0
        )
        assert store.trigger_schedule("nightly", start, clock.now()) == "run-t"
        got = store.get_schedule("nightly")
        assert got is not None and got.last_run_id == "run-t" and got.last_fire_at == T0

    @pytest.mark.parametrize("poison", ["\x00", "\udcff"])
    def test_a_value_postgres_cannot_hold_is_refused_whole(self, store: Store, poison: str) -> None:
        with pytest.raises((ValueError, Exception)) as caught:
            store.create_schedule(record(labels=(("k", f"v{poison}"),)))
        assert not isinstance(caught.value, AssertionError)
        assert store.list_schedules() == []
        store.create_schedule(record())  # the store goes on
        with pytest.raises(Exception):  # noqa: B017 - each backend names it its own way
            store.set_schedule_paused("nightly", True, f"note{poison}", None, None)
        got = store.get_schedule("nightly")
        assert got is not None and not got.paused


class TestScheduleStoreMemory(MemoryBackend, ScheduleStoreContract):
    pass


class TestScheduleStorePostgres(PostgresBackend, ScheduleStoreContract):
    pass
