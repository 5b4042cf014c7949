"""The schedule store port (docs/reference/contract.md §10): what the engine needs to keep schedules and fire them.

A store keeps each schedule as a :class:`ScheduleRecord`: its definition (the workflow's
arguments already encoded, so a process that does not register the workflow, such as the
CLI, can still start its runs) and its state (paused, next fire, the fire ``buffer_one``
keeps, the last fire). Firing is one call, :meth:`ScheduleStore.advance_schedule`: a
compare-and-set on the row's next fire and, in the same transaction, the start of the run.
So a fire time is consumed once, whatever the number of engines, leaders and crashes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

import attrs

from dex.domain import events as ev
from dex.domain.instance_keys import PLAIN, StartRule
from dex.domain.values import Payload

OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")


@attrs.frozen(kw_only=True)
class ScheduleDefinition:
    """What a store keeps of a :class:`dex.Schedule`: its fields, the arguments encoded."""

    name: str
    workflow_name: str
    cron: str | None
    every: timedelta | None
    timezone: str
    args: tuple[Payload, ...]
    jitter: timedelta
    overlap: str
    catchup_window: timedelta
    start_at: datetime | None
    end_at: datetime | None
    queue: str | None
    priority: int
    labels: ev.Labels
    id_reuse: str = "allow"  # what the instance id of a fire's ended run means (docs/reference/contract.md §15)

    def timing(self) -> tuple[object, ...]:
        """The fields that decide the fire times: when they change, the next fire is recomputed."""
        return (self.cron, self.every, self.timezone, self.start_at, self.end_at)


@attrs.frozen(kw_only=True)
class ScheduleRecord:
    """A schedule as the store keeps it. ``due_at`` is ``next_fire_at`` plus its jitter: when
    the fire starts. ``buffered_fire_at`` is the fire ``buffer_one`` keeps while a run is live."""

    definition: ScheduleDefinition
    created_at: datetime
    paused: bool = False
    note: str = ""
    next_fire_at: datetime | None = None
    due_at: datetime | None = None
    buffered_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    last_run_id: str | None = None

    @property
    def name(self) -> str:
        return self.definition.name


@attrs.frozen(kw_only=True)
class ScheduledStart:
    """A run a fire (or a trigger) starts: its id, its ``RunCreated`` and its fire time."""

    run_id: str
    created: ev.RunCreated
    fire_at: datetime
    rule: StartRule = PLAIN  # the schedule's id_reuse (docs/reference/contract.md §15)


@attrs.frozen(kw_only=True)
class ScheduleAdvance:
    """One step of a schedule: applied only while the row's ``next_fire_at`` and
    ``buffered_fire_at`` are still ``expected_next`` and ``expected_buffered`` (a
    compare-and-set), then the row takes the new values and, with ``start``, the run is
    started in the same transaction and becomes the schedule's last run."""

    name: str
    expected_next: datetime | None
    expected_buffered: datetime | None
    next_fire_at: datetime | None
    due_at: datetime | None
    buffered_fire_at: datetime | None
    start: ScheduledStart | None = None


class ScheduleStore(Protocol):
    def create_schedule(self, record: ScheduleRecord) -> None:
        """Store a new schedule; InvalidStateError when one has this name."""
        ...

    def update_schedule(
        self, definition: ScheduleDefinition, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        """Replace a schedule's definition and next fire, keeping its paused state, note,
        buffered fire and last fire; NotFoundError when there is none of this name."""
        ...

    def delete_schedule(self, name: str) -> None:
        """NotFoundError when there is no schedule of this name."""
        ...

    def set_schedule_paused(
        self, name: str, paused: bool, note: str, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        """Pause or resume, with the next fire from then on; NotFoundError when there is none."""
        ...

    def get_schedule(self, name: str) -> ScheduleRecord | None: ...

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        ...

    def due_schedules(self, now: datetime, limit: int) -> tuple[list[ScheduleRecord], datetime | None]:
        """Up to ``limit`` schedules not paused whose fire is due at ``now`` (``due_at <= now``)
        or that hold a buffered fire, earliest due first; and the earliest ``due_at`` after
        ``now`` among schedules not paused (when the next step has work), in one read."""
        ...

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        """Apply ``advance`` if its compare-and-set holds (else nothing changes: False, None);
        with a start, create the run in the same transaction. Returns whether it applied and
        the id of the run (or of the live run that holds its instance id)."""
        ...

    def trigger_schedule(self, name: str, start: ScheduledStart, now: datetime) -> str:
        """Start ``start``'s run and make it the schedule's last run, in one transaction;
        NotFoundError when there is no schedule of this name."""
        ...
