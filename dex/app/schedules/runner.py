"""ScheduleRunner: the leader's step that starts the runs of due schedule fires (docs/reference/contract.md §10).

Only the leader steps it (the scheduler round of ``dex.app.runtime.rounds.Rounds``, after the leader election, or
``Engine.drain``), so the database work per fire does not grow with the number of engines:
followers do nothing per fire. Each fire is one store call, ``advance_schedule``: a
compare-and-set on the schedule's next fire and, in the same transaction, the start of the
run with ``instance_id = schedule:<name>:<fire time>``. A fire's time is consumed exactly
once, so it starts at most one run ever, even when two nodes both believe they lead for a
moment or one crashes between any two calls: the loser's compare-and-set changes nothing.

A schedule whose step fails is set aside; the other schedules of the step go on. One whose
next fire time cannot be computed (:class:`~dex.app.schedules.times.UncomputableFireError`: a
definition stored before today's bounds, say) is paused, the reason in its note, and logged
once: it would fail the same way at every step. Any other fault (the store's) is logged once,
with its traceback, and that schedule is tried again after a pause that doubles with each
failure in a row (from ``refresh`` up to :data:`MAX_BACKOFF`), never at every step; when it
succeeds again, that is logged too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from dex.app.ports.ids import new_run_id
from dex.app.ports.schedules import ScheduleAdvance, ScheduledStart, ScheduleRecord
from dex.app.ports.store import Store
from dex.app.ports.telemetry import TelemetryHub
from dex.app.schedules.spec import SCHEDULE_LABEL
from dex.app.schedules.times import UncomputableFireError, iso_second, jitter_offset, next_fire
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.instance_keys import start_rule
from dex.domain.status import RunStatus

log = logging.getLogger("dex.schedules")

# how many skipped fires a catch-up counts one by one for the metrics (more are counted as this)
_COUNT_LIMIT = 10_000
# the longest pause before a schedule whose step failed is tried again
MAX_BACKOFF = timedelta(minutes=5)
NOTE_LIMIT = 1000  # characters of the note of a schedule dex pauses


def instance_id(name: str, fire_at: datetime) -> str:
    """``schedule:<name>:<fire time, UTC, whole seconds>``: the one run a fire may start."""
    return f"schedule:{name}:{iso_second(fire_at)}"


def trigger_instance_id(name: str, now: datetime) -> str:
    return f"schedule:{name}:trigger:{iso_second(now)}"


def due_at(record_name: str, fire_at: datetime | None, jitter: timedelta) -> datetime | None:
    """When the fire at ``fire_at`` starts: its nominal time plus its deterministic jitter;
    :class:`UncomputableFireError` when that is past what a datetime holds."""
    if fire_at is None:
        return None
    try:
        return fire_at + jitter_offset(record_name, fire_at, jitter)
    except OverflowError:
        raise UncomputableFireError(
            f"schedule {record_name!r}: its next fire at {fire_at.isoformat()} with its jitter of {jitter} "
            "cannot be computed (past the year 9999)"
        ) from None


def scheduled_start(
    record: ScheduleRecord, iid: str, fire_at: datetime, seed: int, code_version: str | None = None
) -> ScheduledStart:
    """The run a fire of ``record`` starts (its instance id ``iid``), labelled ``dex.schedule``."""
    d = record.definition
    assert d.queue is not None  # the engine resolves the workflow's queue when it stores a schedule
    created = ev.RunCreated(
        workflow_name=d.workflow_name,
        input=d.args,
        queue=d.queue,
        instance_id=iid,
        priority=d.priority,
        labels=tuple(sorted({**dict(d.labels), SCHEDULE_LABEL: d.name}.items())),
        random_seed=seed,
        code_version=code_version,
    )
    return ScheduledStart(run_id=new_run_id(), created=created, fire_at=fire_at, rule=start_rule(iid, d.id_reuse))


@attrs.frozen
class _Failing:
    """A schedule whose steps failed ``failures`` times in a row; tried again at ``retry_at``."""

    failures: int
    retry_at: datetime


class ScheduleRunner:
    """Starts the runs of due fires, one compare-and-set per fire; ``step()`` returns how many
    fires it handled (started or skipped)."""

    def __init__(
        self,
        store: Store,
        *,
        telemetry: TelemetryHub | None = None,
        rng: random.Random | None = None,
        refresh: timedelta = timedelta(seconds=1),
        batch_size: int = 100,
        on_started: Callable[[str], None] | None = None,
        code_version: str | None = None,
    ) -> None:
        self._store, self._refresh, self._batch_size = store, refresh, batch_size
        self.code_version = code_version  # recorded in the runs the fires start
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._rng = rng or random.Random()
        self._on_started = on_started
        # when to read the due schedules again: at the earliest known due fire, and at least
        # every `refresh` (schedules made or resumed by other processes)
        self._read_at: datetime | None = None
        self._failing: dict[str, _Failing] = {}  # schedules set aside after a failed step

    def wake(self) -> None:
        """Read the schedules at the next step (this process changed one)."""
        self._read_at = None

    def step(self, bound: datetime | None = None) -> int:
        """Handle the fires due now; the number handled.

        With ``bound`` (``Engine.drain``), only fires due by ``bound``, and a store error is
        raised to the caller once the other schedules had their turn, as drain raises every
        store error (it must not jump the clock past a fire that failed)."""
        now = self._store.clock.now()
        if bound is None and self._read_at is not None and now < self._read_at:
            return 0
        limit = now if bound is None else min(now, bound)
        records, following = self._store.due_schedules(limit, self._batch_size)
        handled, failed, waiting = 0, None, 0
        for record in records:
            held = self._failing.get(record.name)
            if bound is None and held is not None and now < held.retry_at:
                waiting += 1
                continue
            try:
                handled += self._step_schedule(record, now, limit)
            except (UncomputableFireError, OverflowError) as exc:  # the same at every step: pause it
                self._set_aside(record, exc, now)
            except Exception as exc:  # the store failed: this fire is tried again after a pause
                # logged once per spell of failures, not at every retry
                first = self._failed(record.name, now) == 1
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "schedule %r: its fire failed; tried again after growing pauses",
                    record.name,
                    exc_info=True,
                )
                failed = failed or exc
            else:
                if self._failing.pop(record.name, None) is not None:
                    log.info("schedule %r: its fires work again", record.name)
        # forget a schedule not tried again long after its time: it is no longer due (deleted, paused)
        self._failing = {n: f for n, f in self._failing.items() if f.retry_at > now - MAX_BACKOFF}
        retries = [f.retry_at for f in self._failing.values() if f.retry_at > now]
        self._read_at = min(filter(None, (following, now + self._refresh, *retries)))
        if len(records) >= self._batch_size and waiting < len(records):
            self._read_at = None  # more may be due
        if failed is not None and bound is not None:
            raise failed
        return handled

    def next_due(self, now: datetime) -> datetime | None:
        """The earliest fire due after ``now`` (for ``Engine.drain(until=...)``)."""
        return self._store.due_schedules(now, 0)[1]

    def _failed(self, name: str, now: datetime) -> int:
        """Set ``name`` aside after a failed step, for twice as long as the last time; how many
        times in a row it failed."""
        failures = self._failing[name].failures + 1 if name in self._failing else 1
        pause = min(self._refresh * 2 ** min(failures - 1, 30), MAX_BACKOFF)
        self._failing[name] = _Failing(failures=failures, retry_at=now + pause)
        return failures

    def _set_aside(self, record: ScheduleRecord, exc: Exception, now: datetime) -> None:
        """Pause a schedule whose next fire cannot be computed, saying why in its note (an
        operator sees it in ``list_schedules``; ``update_schedule`` then ``resume_schedule`` mend it)."""
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, UncomputableFireError):  # a fire plus its jitter past what a datetime holds
            reason = f"schedule {record.name!r}: its next fire (with its jitter) cannot be computed ({reason})"
        # text a store takes: no NUL, no lone surrogate (what a stored time zone may hold), bounded
        reason = reason.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
        note = f"paused by dex: {reason}"[:NOTE_LIMIT]
        try:
            self._store.set_schedule_paused(record.name, True, note, record.next_fire_at, record.due_at)
        except Exception:  # the store failed too: set aside like any failed step, tried again later
            first = self._failed(record.name, now) == 1
            log.log(logging.WARNING if first else logging.DEBUG, "schedule %r: %s", record.name, note, exc_info=True)
            return
        self._failing.pop(record.name, None)
        log.error("schedule %r: %s", record.name, note)

    # -- one schedule ----------------------------------------------------------------------
    def _step_schedule(self, record: ScheduleRecord, now: datetime, limit: datetime) -> int:
        handled = 0
        if record.buffered_fire_at is not None and not self._live(record):
            new = self._advance(record, record.next_fire_at, record.due_at, None, record.buffered_fire_at)
            if new is None:
                return handled
            record, handled = new, handled + 1
        for _ in range(self._batch_size):
            if record.next_fire_at is None or record.due_at is None or record.due_at > limit:
                break
            new = self._fire(record, now)
            if new is None:  # another node moved it first: nothing more to do here
                break
            record, handled = new, handled + 1
        return handled

    def _fire(self, record: ScheduleRecord, now: datetime) -> ScheduleRecord | None:
        d = record.definition
        fire_at = record.next_fire_at
        assert fire_at is not None
        # lateness counts from when the fire was due to start (its jitter included), so a
        # jitter longer than the window does not skip every fire
        if now - (record.due_at or fire_at) >= d.catchup_window:  # not younger than the window: skipped
            following = next_fire(d, record.created_at, now - d.catchup_window)
            self._skipped(d.name, "catchup", self._count(record, fire_at, following))
            return self._advance(record, following, due_at(d.name, following, d.jitter), record.buffered_fire_at)
        following = next_fire(d, record.created_at, fire_at)
        due = due_at(d.name, following, d.jitter)
        if d.overlap != "allow_all" and self._live(record):
            if d.overlap == "skip" or (d.overlap == "buffer_one" and record.buffered_fire_at is not None):
                self._skipped(d.name, "overlap", 1)
                return self._advance(record, following, due, record.buffered_fire_at)
            if d.overlap == "buffer_one":
                return self._advance(record, following, due, fire_at)
            self._cancel(record)  # cancel_other: the new run replaces the live one
        return self._advance(record, following, due, record.buffered_fire_at, fire_at)

    def _advance(
        self,
        record: ScheduleRecord,
        following: datetime | None,
        due: datetime | None,
        buffered: datetime | None,
        start_fire: datetime | None = None,
    ) -> ScheduleRecord | None:
        """The compare-and-set of one step; the record as it is now, or None if it was lost."""
        start = None
        if start_fire is not None:
            iid = instance_id(record.name, start_fire)
            start = scheduled_start(record, iid, start_fire, self._rng.getrandbits(64), self.code_version)
        advance = ScheduleAdvance(
            name=record.name,
            expected_next=record.next_fire_at,
            expected_buffered=record.buffered_fire_at,
            next_fire_at=following,
            due_at=due,
            buffered_fire_at=None if start_fire is not None and start_fire == buffered else buffered,
            start=start,
        )
        applied, run_id = self._store.advance_schedule(advance, self._store.clock.now())
        if not applied:
            self._read_at = None
            return None
        changes: dict[str, object] = {
            "next_fire_at": advance.next_fire_at,
            "due_at": advance.due_at,
            "buffered_fire_at": advance.buffered_fire_at,
        }
        if start is not None and run_id is not None:
            changes.update(last_fire_at=start.fire_at, last_run_id=run_id)
            lag = (self._store.clock.now() - start.fire_at).total_seconds()
            self._fired(record.name, lag)
            if self._on_started is not None:
                self._on_started(run_id)
        return attrs.evolve(record, **changes)  # type: ignore[arg-type]

    def _live(self, record: ScheduleRecord) -> bool:
        """Whether the schedule's last run is live (a SUSPENDED run counts as live)."""
        if record.last_run_id is None:
            return False
        run = self._store.get_run(record.last_run_id)
        return run is not None and not run.status.is_terminal

    def _cancel(self, record: ScheduleRecord) -> None:
        assert record.last_run_id is not None
        message = ev.RunCancelled(reason=f"schedule {record.name}: a new fire replaces it (overlap=cancel_other)")
        try:
            self._store.request_transition(record.last_run_id, RunStatus.CANCELLED, message, self._store.clock.now())
        except (InvalidStateError, RunNotFoundError):
            pass  # it ended (or is being cancelled) meanwhile: nothing to replace

    def _count(self, record: ScheduleRecord, fire_at: datetime, following: datetime | None) -> int:
        """How many fires from ``fire_at`` up to (not including) ``following`` a catch-up skips."""
        count = 0
        moment: datetime | None = fire_at
        while moment is not None and (following is None or moment < following) and count < _COUNT_LIMIT:
            count += 1
            moment = next_fire(record.definition, record.created_at, moment)
        return count

    def _fired(self, name: str, lag: float) -> None:
        try:
            self._telemetry.schedule_fired(name, lag)
        except Exception:  # a metrics sink's fault is not the fire's
            log.warning("a telemetry sink failed on schedule_fired", exc_info=True)

    def _skipped(self, name: str, reason: str, count: int) -> None:
        log.info("schedule %r: %d fire(s) skipped (%s)", name, count, reason)
        try:
            self._telemetry.schedule_skipped(name, reason, count)
        except Exception:  # a metrics sink's fault is not the fire's
            log.warning("a telemetry sink failed on schedule_skipped", exc_info=True)
