"""Managing schedules (docs/reference/contract.md §10): create, update, delete, pause, resume, trigger, backfill, read.

:class:`ScheduleAdmin` does each over a store alone (the CLI uses it without an engine: the
arguments are stored encoded, so no workflow code is needed to start a schedule's run);
:class:`ScheduleCalls`, the service behind ``Engine``'s schedule methods, adds what needs the
registry (making a stored definition from a :class:`Schedule`) and keeps the engine's
:class:`~dex.app.schedules.runner.ScheduleRunner` informed of changes. :func:`drain_bound` and
:func:`drain_jump` are how ``Engine.drain`` bounds the fires it starts and moves a virtual clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

import attrs

from dex.app.definitions.registry import Registry
from dex.app.ports.clock import VirtualClock
from dex.app.ports.schedules import ScheduleDefinition, ScheduleRecord
from dex.app.ports.store import RunFilter, Store
from dex.app.schedules.runner import ScheduleRunner, due_at, instance_id, scheduled_start, trigger_instance_id
from dex.app.schedules.spec import Schedule, ScheduleInfo
from dex.app.schedules.times import next_fire
from dex.domain.definitions import PayloadConverter, validate_name, validate_text
from dex.domain.errors import InvalidStateError, NotFoundError

# a backfill that would start more runs than this is refused (a typo in a range, not a plan)
BACKFILL_LIMIT = 100_000


def _name(name: object) -> str:
    return validate_name(name, "schedule name")


def _aware(moment: object, field: str) -> datetime:
    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{field} must be an aware datetime (with a tzinfo), got {moment!r}")
    return moment.astimezone(UTC)


class ScheduleAdmin:
    """The operations on stored schedules that need no workflow code."""

    def __init__(self, store: Store, rng: random.Random | None = None, code_version: str | None = None) -> None:
        self.store, self._rng, self.code_version = store, rng or random.Random(), code_version

    def record(self, name: str) -> ScheduleRecord:
        record = self.store.get_schedule(_name(name))
        if record is None:
            raise NotFoundError(f"no schedule named {name!r}")
        return record

    def create(self, definition: ScheduleDefinition, paused: bool = False) -> None:
        now = self.store.clock.now()
        following = next_fire(definition, now, now)
        record = ScheduleRecord(
            definition=definition,
            created_at=now,
            paused=paused,
            next_fire_at=following,
            due_at=due_at(definition.name, following, definition.jitter),
        )
        self.store.create_schedule(record)

    def update(self, definition: ScheduleDefinition) -> None:
        """Replace the definition; the next fire moves only when the fire times changed."""
        record = self.record(definition.name)
        following = record.next_fire_at
        if definition.timing() != record.definition.timing():
            following = next_fire(definition, record.created_at, self.store.clock.now())
        self.store.update_schedule(definition, following, due_at(definition.name, following, definition.jitter))

    def delete(self, name: str) -> None:
        self.store.delete_schedule(_name(name))

    def pause(self, name: str, note: str = "") -> None:
        record = self.record(name)
        note = validate_text(note, "note")
        self.store.set_schedule_paused(record.name, True, note, record.next_fire_at, record.due_at)

    def resume(self, name: str) -> None:
        """Resume from now: the fires due while paused are skipped."""
        record = self.record(name)
        d = record.definition
        following = next_fire(d, record.created_at, self.store.clock.now())
        self.store.set_schedule_paused(record.name, False, "", following, due_at(d.name, following, d.jitter))

    def trigger(self, name: str) -> str:
        """One run now, whatever the time, pause or overlap."""
        record = self.record(name)
        now = self.store.clock.now()
        fire_at = now.replace(microsecond=0)
        iid = trigger_instance_id(record.name, fire_at)
        start = scheduled_start(record, iid, fire_at, self._rng.getrandbits(64), self.code_version)
        return self.store.trigger_schedule(record.name, start, now)

    def backfill(self, name: str, start: datetime, end: datetime) -> list[str]:
        """A run for every fire time in ``[start, end)`` that has none yet, in fire order."""
        record = self.record(name)
        start, end = _aware(start, "start"), _aware(end, "end")
        now = self.store.clock.now()
        if end > now:
            raise ValueError(f"end {end.isoformat()} is in the future (now {now.isoformat()}): backfill fills the past")
        fires: list[datetime] = []
        moment = next_fire(record.definition, record.created_at, start - timedelta(microseconds=1))
        while moment is not None and moment < end:
            if len(fires) >= BACKFILL_LIMIT:
                raise ValueError(f"backfill of {name!r} would start more than {BACKFILL_LIMIT} runs: narrow the range")
            fires.append(moment)
            moment = next_fire(record.definition, record.created_at, moment)
        run_ids = []
        for fire_at in fires:
            iid = instance_id(record.name, fire_at)
            if self.store.list_runs(RunFilter(instance_id=iid, limit=1)):
                continue  # this fire has its run already
            run = scheduled_start(record, iid, fire_at, self._rng.getrandbits(64), self.code_version)
            if run.rule.plain:
                run_ids.append(self.store.create_run(run.run_id, run.created, self.store.clock.now()))
            else:  # the schedule's id_reuse, decided with the id's lock held (docs/reference/contract.md §15)
                run_ids.append(self.store.start_keyed_run(run.run_id, run.created, self.store.clock.now(), run.rule))
        return run_ids

    def get(self, name: str) -> ScheduleInfo:
        return ScheduleInfo.of(self.record(name))

    def list(self) -> list[ScheduleInfo]:
        return [ScheduleInfo.of(record) for record in self.store.list_schedules()]


class ScheduleCalls:
    """``Engine``'s schedule methods, over ``admin``'s store.

    ``runner`` is the engine's :class:`~dex.app.schedules.runner.ScheduleRunner`, woken when a
    schedule changes (its next fire may have moved); ``nudge_scheduler`` wakes the task
    scheduler of a started engine, which makes the workflow tasks of the runs a call started.
    """

    def __init__(
        self,
        admin: ScheduleAdmin,
        runner: ScheduleRunner,
        registry: Registry,
        converter: PayloadConverter,
        *,
        nudge_scheduler: Callable[[], None],
    ) -> None:
        self._admin = admin
        self._store = admin.store
        self._runner = runner
        self._registry = registry
        self._converter = converter
        self._nudge_scheduler = nudge_scheduler

    def _definition(self, schedule: Schedule) -> ScheduleDefinition:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"expected a dex.Schedule, got {type(schedule).__name__}")
        workflow = self._registry.workflow(schedule.workflow)  # NotRegisteredError: say so now
        workflow.signature.check_arity(len(schedule.args), f"schedule {schedule.name!r}: workflow {workflow.name!r}")
        definition = schedule.definition(self._converter)
        return attrs.evolve(definition, queue=schedule.queue or workflow.queue)

    def declare(self, schedules: Iterable[Schedule]) -> None:
        """Create or update the schedules given to ``Engine(schedules=)``; an operator's pause
        or resume stands (only a new schedule takes the declared ``paused``)."""
        schedules = tuple(schedules)
        declared = [self._definition(s) for s in schedules]
        names = [d.name for d in declared]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"two schedules are named {duplicates[0]!r} in Engine(schedules=)")
        paused = {s.name: s.paused for s in schedules}
        for definition in declared:
            record = self._store.get_schedule(definition.name)
            if record is None:
                try:
                    self._admin.create(definition, paused=paused[definition.name])
                    continue
                except InvalidStateError:  # another engine starting with us created it first
                    record = self._store.get_schedule(definition.name)
            if record is not None and record.definition != definition:
                self._admin.update(definition)
        self._runner.wake()

    def create_schedule(self, schedule: Schedule) -> None:
        """Store a new schedule; InvalidStateError when one has this name."""
        self._admin.create(self._definition(schedule), paused=schedule.paused)
        self._changed()

    def update_schedule(self, schedule: Schedule) -> None:
        """Replace a schedule's definition, keeping its paused state, note and last fire."""
        self._admin.update(self._definition(schedule))
        self._changed()

    def delete_schedule(self, name: str) -> None:
        self._admin.delete(name)
        self._changed()

    def pause_schedule(self, name: str, note: str = "") -> None:
        self._admin.pause(name, note)
        self._changed()

    def resume_schedule(self, name: str) -> None:
        self._admin.resume(name)
        self._changed()

    def trigger_schedule(self, name: str) -> str:
        """Start one run of the schedule now, whatever the time, pause or overlap; its run id."""
        run_id = self._admin.trigger(name)
        self._nudge_scheduler()
        return run_id

    def backfill_schedule(self, name: str, start: datetime, end: datetime) -> list[str]:
        """Start a run for every fire time in ``[start, end)`` that has none yet; their ids."""
        run_ids = self._admin.backfill(name, start, end)
        self._nudge_scheduler()
        return run_ids

    def get_schedule(self, name: str) -> ScheduleInfo:
        return self._admin.get(name)

    def list_schedules(self) -> list[ScheduleInfo]:
        return self._admin.list()

    def _changed(self) -> None:
        self._runner.wake()
        self._nudge_scheduler()


def drain_bound(store: Store, until: datetime | timedelta | None) -> datetime:
    """The latest fire ``drain`` may start: ``until``, or the store's clock's time now."""
    now = store.clock.now()
    if until is None:
        return now
    if isinstance(until, timedelta):
        return now + until
    return _aware(until, "until")


def drain_jump(store: Store, runner: ScheduleRunner, advance_time: bool, until: datetime | None) -> bool:
    """Jump a VirtualClock to where ``drain`` goes on: the next timer, retry or lease
    expiry; with ``until``, also ``runner``'s next schedule fire, none of them past ``until``,
    and then ``until``. False: nothing left to jump to (drain returns)."""
    clock = store.clock
    if not advance_time or not isinstance(clock, VirtualClock):
        return False
    now = clock.now()
    due = store.next_due_time(now)
    if until is not None:
        moments = [m for m in (due, runner.next_due(now)) if m is not None and m <= until]
        due = min(moments) if moments else (until if now < until else None)
    if due is None:
        return False
    clock.advance_to(due)
    return True
