"""The in-memory adapter's schedules (docs/reference/contract.md §10): a dict of records under the store's lock.

Each operation holds the store's one lock, so the compare-and-set of
:meth:`advance_schedule` and the run it starts are atomic together, as one transaction is in
PostgreSQL. Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import attrs

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.app.ports.schedules import ScheduleAdvance, ScheduleDefinition, ScheduledStart, ScheduleRecord
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError, NotFoundError
from dex.domain.instance_keys import StartRule


def _check_definition(definition: ScheduleDefinition) -> None:
    """What PostgreSQL would refuse in a schedule's text columns and labels (see storable)."""
    for field in ("name", "workflow_name", "cron", "timezone", "overlap", "queue"):
        storable.text(getattr(definition, field), f"schedule {field}")
    storable.labels(definition.labels, "schedule labels")


class MemorySchedules:
    """The schedule-store operations of the in-memory adapter: its records, and the runs its
    fires start with ``create_run`` (the adapter's port, so that what wraps it sees those
    starts too), under the same lock."""

    def __init__(
        self,
        state: MemoryState,
        create_run: Callable[[str, ev.RunCreated, datetime], str],
        start_keyed_run: Callable[[str, ev.RunCreated, datetime, StartRule], str],
    ) -> None:
        self._state = state
        self._create_run = create_run
        self._start_keyed_run = start_keyed_run
        self._records: dict[str, ScheduleRecord] = {}

    def _schedule(self, name: str) -> ScheduleRecord:
        record = self._records.get(name)
        if record is None:
            raise NotFoundError(f"no schedule named {name!r}")
        return record

    def create_schedule(self, record: ScheduleRecord) -> None:
        _check_definition(record.definition)
        storable.text(record.note, "note")
        with self._state.lock:
            if record.name in self._records:
                raise InvalidStateError(f"a schedule named {record.name!r} exists already")
            self._records[record.name] = record

    def update_schedule(
        self, definition: ScheduleDefinition, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        _check_definition(definition)
        with self._state.lock:
            record = self._schedule(definition.name)
            self._records[definition.name] = attrs.evolve(
                record, definition=definition, next_fire_at=next_fire_at, due_at=due_at
            )

    def delete_schedule(self, name: str) -> None:
        storable.text(name, "schedule name")
        with self._state.lock:
            self._schedule(name)
            del self._records[name]

    def set_schedule_paused(
        self, name: str, paused: bool, note: str, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        storable.text(name, "schedule name")
        storable.text(note, "note")
        with self._state.lock:
            record = self._schedule(name)
            self._records[name] = attrs.evolve(
                record, paused=paused, note=note, next_fire_at=next_fire_at, due_at=due_at
            )

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        storable.text(name, "schedule name")
        with self._state.lock:
            return self._records.get(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._state.lock:
            return [self._records[name] for name in sorted(self._records)]

    def due_schedules(self, now: datetime, limit: int) -> tuple[list[ScheduleRecord], datetime | None]:
        with self._state.lock:
            active = [r for r in self._records.values() if not r.paused]
            due = [r for r in active if (r.due_at is not None and r.due_at <= now) or r.buffered_fire_at is not None]
            due.sort(key=lambda r: (r.due_at is None, r.due_at or now, r.name))
            later = [r.due_at for r in active if r.due_at is not None and r.due_at > now]
            return due[:limit], min(later) if later else None

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        if advance.start is not None:
            storable.created(advance.start.run_id, advance.start.created)
        with self._state.lock:
            record = self._records.get(advance.name)
            if (
                record is None
                or record.next_fire_at != advance.expected_next
                or record.buffered_fire_at != advance.expected_buffered
            ):
                return False, None
            changes: dict[str, object] = {
                "next_fire_at": advance.next_fire_at,
                "due_at": advance.due_at,
                "buffered_fire_at": advance.buffered_fire_at,
            }
            run_id = None
            if advance.start is not None:
                run_id = self._start(advance.start, now)
                changes.update(last_fire_at=advance.start.fire_at, last_run_id=run_id)
            self._records[advance.name] = attrs.evolve(record, **changes)  # type: ignore[arg-type]
            return True, run_id

    def trigger_schedule(self, name: str, start: ScheduledStart, now: datetime) -> str:
        storable.created(start.run_id, start.created)
        with self._state.lock:
            record = self._schedule(name)
            run_id = self._start(start, now)
            self._records[name] = attrs.evolve(record, last_fire_at=start.fire_at, last_run_id=run_id)
            return run_id

    def _start(self, start: ScheduledStart, now: datetime) -> str:
        """The fire's run, under the schedule's id_reuse (docs/reference/contract.md §15)."""
        if start.rule.plain:
            return self._create_run(start.run_id, start.created, now)
        return self._start_keyed_run(start.run_id, start.created, now, start.rule)
