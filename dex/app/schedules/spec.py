"""``dex.Schedule`` and ``dex.ScheduleInfo`` (docs/reference/contract.md §10): a workflow started on a cron or interval.

A :class:`Schedule` is a frozen value checked when it is made: an invalid cron expression
(a reversed range too), a time zone IANA does not name (``localtime`` too), a name, a period
or a time out of range (see :mod:`dex.app.schedules.times`), or a bad combination raises
``ValueError`` naming the problem, so a bad schedule never reaches a store. :class:`ScheduleInfo` is what ``Engine.get_schedule`` and
``list_schedules`` report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.app.definitions.registry import WORKFLOW_ATTRIBUTE
from dex.app.ports.schedules import OVERLAP_POLICIES, ScheduleDefinition, ScheduleRecord
from dex.app.schedules.times import (
    check_cron,
    check_cron_fires_after,
    check_period,
    check_time,
    check_zone,
)
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, validate_name, validate_priority, validate_queue
from dex.domain.errors import SerializationError
from dex.domain.instance_keys import start_rule
from dex.domain.steps import normalize_labels

SCHEDULE_LABEL = "dex.schedule"


def workflow_name_of(workflow: object) -> str:
    """The workflow's name: ``workflow`` is a name or a function decorated with ``@dex.workflow``."""
    if isinstance(workflow, str):
        return validate_name(workflow, "workflow name")
    definition = getattr(workflow, WORKFLOW_ATTRIBUTE, None)
    if definition is None:
        raise ValueError(f"workflow must be a name or a @dex.workflow function, got {type(workflow).__name__}")
    return str(definition.name)


@attrs.frozen
class Schedule:
    """A workflow started at the fire times of ``cron`` (in ``timezone``) or every ``every``.

    Exactly one of ``cron`` (5 fields, or 6 with seconds first) and ``every`` (whole seconds,
    at least one). See docs/reference/contract.md §10 for jitter, overlap policies, the catch-up window and the
    daylight-saving rules.
    """

    name: str
    workflow: Callable[..., Any] | str
    cron: str | None = attrs.field(default=None, kw_only=True)
    every: timedelta | None = attrs.field(default=None, kw_only=True)
    timezone: str = attrs.field(default="UTC", kw_only=True)
    args: tuple[Any, ...] = attrs.field(default=(), kw_only=True, converter=tuple)
    jitter: timedelta = attrs.field(default=timedelta(0), kw_only=True)
    overlap: str = attrs.field(default="skip", kw_only=True)
    catchup_window: timedelta = attrs.field(default=timedelta(hours=1), kw_only=True)
    start_at: datetime | None = attrs.field(default=None, kw_only=True)
    end_at: datetime | None = attrs.field(default=None, kw_only=True)
    paused: bool = attrs.field(default=False, kw_only=True)
    queue: str | None = attrs.field(default=None, kw_only=True)
    priority: int = attrs.field(default=0, kw_only=True)
    # a mapping of str to str when given; kept as sorted (key, value) pairs
    labels: ev.Labels = attrs.field(default=None, kw_only=True)
    # what an ended run of a fire's instance id means (docs/reference/contract.md §15)
    id_reuse: str = attrs.field(default="allow", kw_only=True)

    def __attrs_post_init__(self) -> None:
        try:
            self._check()
        except TypeError as exc:  # a value of the wrong type: a ValueError naming it, as all others
            raise ValueError(f"schedule {self.name!r}: {exc}") from None

    def _check(self) -> None:
        validate_name(self.name, "schedule name")
        workflow_name_of(self.workflow)
        if (self.cron is None) == (self.every is None):
            raise ValueError(f"schedule {self.name!r}: give exactly one of cron= and every=")
        if self.cron is not None:
            check_cron(self.cron)
        if self.every is not None:
            every = check_period(self.every, "every", minimum=timedelta(seconds=1))
            if every % timedelta(seconds=1):
                raise ValueError(f"every must be a whole number of seconds, got {every}")
        tz = check_zone(self.timezone)
        check_period(self.jitter, "jitter", minimum=timedelta(0))
        check_period(self.catchup_window, "catchup_window", minimum=timedelta(0))
        if self.overlap not in OVERLAP_POLICIES:
            raise ValueError(f"invalid overlap {self.overlap!r}: it must be one of {', '.join(OVERLAP_POLICIES)}")
        start, end = check_time(self.start_at, "start_at"), check_time(self.end_at, "end_at")
        if start is not None and end is not None and end < start:
            raise ValueError(f"end_at {end.isoformat()} is before start_at {start.isoformat()}")
        if self.cron is not None and start is not None:
            check_cron_fires_after(self.cron, tz, start)
        if not isinstance(self.paused, bool):
            raise ValueError(f"paused must be True or False, got {self.paused!r}")
        if self.queue is not None:
            validate_queue(self.queue)
        validate_priority(self.priority)
        object.__setattr__(self, "id_reuse", start_rule("schedule", self.id_reuse).id_reuse)
        raw: Any = self.labels
        raw = dict(raw) if isinstance(raw, tuple) else raw
        if isinstance(raw, Mapping) and not all(type(k) is str and type(v) is str for k, v in raw.items()):
            # named by type: normalize_labels would show the values, and a repr may raise
            kinds = sorted({f"{type(k).__name__}: {type(v).__name__}" for k, v in raw.items()})
            raise ValueError(f"labels must map str to str, got {', '.join(kinds)}")
        labels = normalize_labels(raw)
        if any(key == SCHEDULE_LABEL for key, _ in labels):
            raise ValueError(f"the label {SCHEDULE_LABEL!r} is set by dex: choose another key")
        object.__setattr__(self, "labels", labels)

    @property
    def workflow_name(self) -> str:
        return workflow_name_of(self.workflow)

    def definition(self, converter: PayloadConverter) -> ScheduleDefinition:
        """What a store keeps of this schedule, the arguments encoded by ``converter``."""
        args = []
        for index, arg in enumerate(self.args):
            try:
                args.append(converter.encode(arg))
            except SerializationError as exc:
                raise SerializationError(f"schedule {self.name!r} argument {index}: {exc}") from exc
        return ScheduleDefinition(
            name=self.name,
            workflow_name=self.workflow_name,
            cron=self.cron,
            every=self.every,
            timezone=self.timezone,
            args=tuple(args),
            jitter=self.jitter,
            overlap=self.overlap,
            catchup_window=self.catchup_window,
            start_at=self.start_at,
            end_at=self.end_at,
            queue=self.queue,
            priority=self.priority,
            labels=self.labels,
            id_reuse=self.id_reuse,
        )


@attrs.frozen(kw_only=True)
class ScheduleInfo:
    """A schedule as ``Engine.get_schedule`` and ``list_schedules`` report it; times are aware,
    in UTC, and nominal (before jitter)."""

    name: str
    workflow_name: str
    cron: str | None
    every: timedelta | None
    timezone: str
    overlap: str
    jitter: timedelta
    catchup_window: timedelta
    paused: bool
    note: str
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    last_run_id: str | None
    start_at: datetime | None = None
    end_at: datetime | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict)
    id_reuse: str = "allow"

    @classmethod
    def of(cls, record: ScheduleRecord) -> ScheduleInfo:
        d = record.definition
        return cls(
            name=d.name,
            workflow_name=d.workflow_name,
            cron=d.cron,
            every=d.every,
            timezone=d.timezone,
            overlap=d.overlap,
            jitter=d.jitter,
            catchup_window=d.catchup_window,
            paused=record.paused,
            note=record.note,
            next_fire_at=record.next_fire_at,
            last_fire_at=record.last_fire_at,
            last_run_id=record.last_run_id,
            start_at=d.start_at,
            end_at=d.end_at,
            labels=dict(d.labels),
            id_reuse=d.id_reuse,
        )
