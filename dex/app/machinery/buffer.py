"""The write buffer: task outcomes, external events and heartbeats, written in batches.

Writing a batch in one call (a few multi-row statements in PostgreSQL) instead of one call per
item is what makes completions cheap. A started engine's flushers write whatever is buffered as
soon as they are free, so batches grow with the load and a lone workflow is not slowed by the
buffer. External events are a group commit: ``send_event``
returns only once its batch is written, so the caller still learns about a missing or finished
run, while concurrent senders share one write.

A batch the store cannot write now (the connection lost, a timeout) is kept whole for the next
flush; a batch it answers with an error for its data (``StoreWriteError``: a value it refuses,
``StoreRejectedError``, or a statement that fails for one item) is split down to the items that
fail, each settled alone — a refused one fails its run, another is retried alone with a
backoff — and the rest is written at once (:mod:`dex.app.machinery.refusals`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from dex.app.machinery.refusals import (
    GiveBack,
    PendingMessage,
    bisect,
    write_activity_outcomes,
    write_messages,
    write_workflow_results,
)
from dex.app.ports.store import (
    ACTIVITY,
    DEFAULT_ACTIVITY_LEASE,
    WORKFLOW,
    ActivityOutcome,
    ActivityTask,
    AnsweredStep,
    Claim,
    Loaded,
    Store,
    StoreWriteError,
    WorkflowTask,
)
from dex.app.ports.telemetry import Telemetry, TelemetryHub
from dex.domain import events as ev
from dex.domain.task import WorkflowTaskResult

log = logging.getLogger("dex.buffer")

SCHEDULING = "scheduling"
# the two lanes a started engine flushes in parallel (see ResultBuffer.flush)
ACTIVITY_LANE, WORKFLOW_LANE = "activity outcomes", "workflow results"
EVERYTHING = frozenset({WORKFLOW, ACTIVITY, SCHEDULING})


class Dispatch(Protocol):
    """Who runs the tasks a flush claims ("complete, then claim"): a started engine.

    ``active`` says whether the engine runs now (its flushers write what is added, and
    completions claim for it); while it does not, adders flush themselves and nothing is
    claimed. ``activity_claim`` reserves room for the activity tasks it asks for; the buffer
    always answers with ``activities_claimed`` (with no tasks when the write failed), which
    runs what was claimed and frees the rest of the reservation.
    """

    def active(self) -> bool: ...

    def activity_claim(self) -> Claim | None: ...

    def activities_claimed(self, claim: Claim, tasks: list[ActivityTask]) -> None: ...

    def workflow_claim(self, run_ids: Sequence[str]) -> Claim | None: ...

    def start_claim(self) -> Claim | None: ...

    def workflows_claimed(
        self, tasks: list[WorkflowTask], loaded: list[Loaded] | None = None, now: datetime | None = None
    ) -> None: ...


class ResultBuffer:
    """Writes waiting to go to the store.

    While its ``dispatch`` is active (a started engine has flusher threads), adders return at
    once and the flushers write batches; otherwise the adder flushes itself, as ``drain()``
    needs. ``give_back`` gives a workflow task back to be retried later
    (``WorkflowWorker.retry_later``), for a result the store refuses even as the run's failure.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_batch: int = 256,
        on_flush: Callable[[frozenset[str]], None] | None = None,
        on_written: Callable[[WorkflowTask, WorkflowTaskResult, bool], None] | None = None,
        telemetry: Telemetry | None = None,
        activity_lease: timedelta = DEFAULT_ACTIVITY_LEASE,
        dispatch: Dispatch | None = None,
        give_back: GiveBack | None = None,
    ) -> None:
        self._store = store
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._on_written = on_written
        self._max_batch = max_batch
        self._on_flush = on_flush
        # guards the buffered items (lists and dicts below): every thread of the engine adds to
        # them (workers, attempts, application calls) and two flushers take from them; the
        # buffer is their one owner, and this is its lock, held only to move items in or out
        self._lock = threading.Lock()
        # one flush per lane at a time (the flusher's, drain's, stop's): a run's results are
        # written in the order they were added, and a second flush of the lane could write a
        # later one while an earlier one is in flight or put back by a failed write; the two
        # lanes' writes are separate transactions, so they do run at once
        self._flush_locks = {ACTIVITY_LANE: threading.Lock(), WORKFLOW_LANE: threading.Lock()}
        # per lane (None: any), over the lock above: an add wakes its lane's flusher only, not
        # both (docs/decisions/batch-window.md)
        self._wanted = {lane: threading.Condition(self._lock) for lane in (ACTIVITY_LANE, WORKFLOW_LANE, None)}
        self._workflow_results: list[tuple[WorkflowTask, WorkflowTaskResult]] = []
        self._activity_outcomes: list[ActivityOutcome] = []
        self._messages: list[PendingMessage] = []
        # keyed by task and lease version: a task this engine claims again (its earlier attempt
        # lost the lease and still runs) is another lease
        self._heartbeats: dict[tuple[int, int], ActivityTask] = {}
        self._lost_leases: set[tuple[int, int]] = set()
        self._activity_lease = activity_lease  # what a heartbeat extends a lease by (leases.py)
        self._abandoned: set[tuple[int, int]] = set()  # (task id, lease version): see abandon()
        self.discarded = 0
        self._give_back = give_back
        self._dispatch = dispatch

    @property
    def background(self) -> bool:
        """Whether a started engine's flushers write what is added (see the class docstring)."""
        return self._dispatch is not None and self._dispatch.active()

    @property
    def dispatch(self) -> Dispatch | None:
        """Who runs what completions claim, while the engine runs (else None)."""
        dispatch = self._dispatch
        return dispatch if dispatch is not None and dispatch.active() else None

    def __len__(self) -> int:
        return len(self._workflow_results) + len(self._activity_outcomes) + len(self._messages) + len(self._heartbeats)

    def add_workflow_result(self, task: WorkflowTask, result: WorkflowTaskResult) -> None:
        with self._lock:
            self._workflow_results.append((task, result))
            self._added(WORKFLOW_LANE)

    def add_workflow_results(self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]]) -> None:
        """Buffer a worker round's results at once, so that one flush writes them together."""
        with self._lock:
            self._workflow_results.extend(results)
            self._added(WORKFLOW_LANE)

    def add_activity_outcome(self, outcome: ActivityOutcome) -> None:
        with self._lock:
            if _lease_key(outcome.task) in self._abandoned:
                self._abandoned.discard(_lease_key(outcome.task))
                log.info(
                    "activity %s of run %s, attempt %d, ended after the engine stopped without it: "
                    "its outcome is dropped, and the task runs again when its lease lapses",
                    outcome.task.name,
                    outcome.task.run_id,
                    outcome.task.attempt,
                    extra={"run_id": outcome.task.run_id, "activity_name": outcome.task.name},
                )
                return
            self._activity_outcomes.append(outcome)
            self._heartbeats.pop(_lease_key(outcome.task), None)
            self._lost_leases.discard(_lease_key(outcome.task))
            self._added(ACTIVITY_LANE)

    def attempt_ended(self, task: ActivityTask) -> None:
        """An attempt whose outcome goes elsewhere (an answered step, dex.app.workflows.answers) ended:
        its queued heartbeat and lost-lease mark go, as when its outcome is added here."""
        with self._lock:
            self._heartbeats.pop(_lease_key(task), None)
            self._lost_leases.discard(_lease_key(task))

    def send_message(self, run_id: str, message: ev.Message) -> None:
        """Write a message to a run's inbox with the next batch, and wait until it is written.

        Raises what the store reports for this message (RunNotFoundError, InvalidStateError).
        """
        pending = PendingMessage(run_id, message)
        with self._lock:
            self._messages.append(pending)
            self._added(WORKFLOW_LANE)  # someone waits: do not hold the batch back
        if not self.background:
            self.flush()
        pending.written.wait()
        if pending.error is not None:
            raise pending.error

    def heartbeat(self, task: ActivityTask) -> bool:
        """Queue a lease extension for ``task``; False once a flush found the lease lost."""
        with self._lock:
            if _lease_key(task) in self._lost_leases or _lease_key(task) in self._abandoned:
                return False
            self._heartbeats[_lease_key(task)] = task
            self._added(ACTIVITY_LANE)
        if not self.background:
            try:
                self.flush()
            except Exception:
                log.info("a heartbeat's flush failed; it is sent again with the next one", exc_info=True)
        with self._lock:
            return _lease_key(task) not in self._lost_leases

    def abandon(self, tasks: Iterable[ActivityTask]) -> None:
        """Refuse whatever these attempts report from now on: a stopped engine left them running
        (docs/reference/contract.md §8). Their outcomes are dropped and their heartbeats say the lease is lost, so
        nothing is written for them after the stop, and their leases lapse for another worker."""
        with self._lock:
            for task in tasks:
                self._abandoned.add(_lease_key(task))
                self._heartbeats.pop(_lease_key(task), None)

    def wake(self) -> None:
        """End a ``wait_for_work`` early (the engine stops)."""
        with self._lock:
            for wanted in self._wanted.values():
                wanted.notify_all()

    def _added(self, lane: str) -> None:  # under the lock
        self._wanted[lane].notify_all()
        self._wanted[None].notify_all()

    def wait_for_work(self, timeout: float, lane: str | None = None, unless: threading.Event | None = None) -> None:
        """Block until something is buffered (in ``lane``, if given), or ``timeout`` seconds passed;
        not at all once ``unless`` is set (checked under the lock ``wake`` takes, so a stop that
        sets it and then wakes cannot slip in between the check and the wait).

        A flusher writes whatever is there as soon as it is free: what arrives while a flush
        is under way waits for the next one, so batches grow with the load by themselves (a
        group commit) and a lone workflow waits for no batch to fill."""
        with self._lock:
            if not self.pending(lane) and not (unless is not None and unless.is_set()):
                self._wanted[lane].wait(timeout)

    def pending(self, lane: str | None) -> int:
        """How many items wait in ``lane`` (None: in either)."""
        if lane == ACTIVITY_LANE:
            return len(self._activity_outcomes) + len(self._heartbeats)
        if lane == WORKFLOW_LANE:
            return len(self._workflow_results) + len(self._messages)
        return len(self)

    def pending_outcomes(self) -> list[ActivityOutcome]:
        """The activity outcomes waiting to be written, oldest first (a copy: the simulator
        reads what a crash loses)."""
        with self._lock:
            return list(self._activity_outcomes)

    def pending_results(self) -> list[tuple[WorkflowTask, WorkflowTaskResult]]:
        """The workflow results waiting to be written, oldest first (a copy)."""
        with self._lock:
            return list(self._workflow_results)

    def flush(self, lane: str | None = None) -> int:
        """Write everything buffered (only ``lane``'s kinds, if given); return how many items
        were written (applied or not).

        The two lanes — activity outcomes and heartbeats; events and workflow results — are
        separate transactions anyway, so a started engine flushes them from two threads at
        once; each lane has its own lock, and a flush without a lane takes both."""
        lanes = (ACTIVITY_LANE, WORKFLOW_LANE) if lane is None else (lane,)
        with contextlib.ExitStack() as held:
            for name in lanes:
                held.enter_context(self._flush_locks[name])
            return self._flush(ACTIVITY_LANE in lanes, WORKFLOW_LANE in lanes)

    def _flush(self, activities: bool, workflows: bool) -> int:
        with self._lock:
            cap = self._max_batch
            workflow_results: list[tuple[WorkflowTask, WorkflowTaskResult]] = []
            activity_outcomes: list[ActivityOutcome] = []
            messages: list[PendingMessage] = []
            heartbeats: list[ActivityTask] = []
            if workflows:
                workflow_results, self._workflow_results = self._workflow_results[:cap], self._workflow_results[cap:]
                messages, self._messages = self._messages, []
            if activities:
                activity_outcomes, self._activity_outcomes = (
                    self._activity_outcomes[:cap],
                    self._activity_outcomes[cap:],
                )
                heartbeats, self._heartbeats = list(self._heartbeats.values()), {}
        count = len(workflow_results) + len(activity_outcomes) + len(messages) + len(heartbeats)
        if not count:
            return 0
        now = self._store.clock.now()
        started = time.perf_counter()
        # what this flush makes due and does not claim, for on_flush: sent events need workflow tasks
        left: set[str] = {SCHEDULING} if messages else set()
        try:
            if messages:
                write_messages(self._store, messages, now)
                messages = []
            if heartbeats:
                # a heartbeat the store refuses is dropped (its lease may lapse: a retry)
                held = bisect(
                    heartbeats,
                    lambda part: self._store.extend_activity_leases(part, now, self._activity_lease),
                    lambda _beat, _exc: True,
                )
                with self._lock:
                    self._lost_leases.update(_lease_key(t) for t, ok in zip(heartbeats, held, strict=True) if not ok)
                heartbeats = []
            if activity_outcomes:
                applied = self._complete_activities(activity_outcomes, now, left)
                self._count_discarded("activity", [o.task for o in activity_outcomes], applied)
                activity_outcomes = []
            if workflow_results:
                written = self._complete_workflows(workflow_results, now, left)  # tells on_written
                self._count_discarded("workflow", [t for t, _ in workflow_results], [ok for _r, ok in written])
        except BaseException as exc:
            # The store may be restarting (or raised worse: a BaseException of a driver or a
            # hook is kept from losing the batch too). Keep what was not written and send it
            # again with the next flush: if a write did land after all, its lease check
            # discards the repeat. Senders of events are told now; they decide whether to
            # retry. (A batch the store fails for its data never gets here: refusals.bisect
            # settles the items that fail and writes the rest.)
            with self._lock:
                self._workflow_results[:0] = workflow_results
                self._activity_outcomes[:0] = activity_outcomes
                for beat in heartbeats:
                    self._heartbeats.setdefault(_lease_key(beat), beat)
            for pending in messages:
                if not pending.written.is_set():
                    pending.error = exc if isinstance(exc, Exception) else ConnectionError(f"the store failed: {exc!r}")
                    pending.written.set()
            log.warning("flushing %d buffered writes failed (%s); they will be sent again", count, type(exc).__name__)
            raise
        self._telemetry.flushed(count, time.perf_counter() - started)
        if self._on_flush is not None:
            self._on_flush(frozenset(left))
        return count

    def _complete_activities(self, outcomes: list[ActivityOutcome], now: datetime, left: set[str]) -> list[bool]:
        """Write activity outcomes; with a dispatch, claim the workflow tasks they make due."""
        dispatch = self.dispatch
        claim = dispatch.workflow_claim([o.task.run_id for o in outcomes]) if dispatch is not None else None
        if dispatch is None or claim is None:
            left.update(EVERYTHING)
            return write_activity_outcomes(self._store, outcomes, now)
        try:
            applied, claimed, loaded = self._store.complete_activity_tasks_then_claim(outcomes, now, claim)
        except StoreWriteError:
            left.update(EVERYTHING)  # the pollers claim what the split writes make due
            return write_activity_outcomes(self._store, outcomes, now)
        answered = sum(1 for outcome, ok in zip(outcomes, applied, strict=True) if ok and outcome.retry_at is None)
        if len(claimed) < answered:
            left.add(WORKFLOW)  # runs that got an answer and whose task we did not claim
            if len(claimed) < claim.limit:
                # not for want of room: the tasks were not made (the scheduler was busy, and
                # will make them) or the runs had one already
                left.add(SCHEDULING)
        if claimed:
            self._telemetry.tasks_claimed("workflow", len(claimed))
            dispatch.workflows_claimed(claimed, loaded, now)
        return applied

    def _complete_workflows(
        self, results: list[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, left: set[str]
    ) -> list[tuple[WorkflowTaskResult, bool]]:
        """Write workflow results; with a dispatch, claim the activity tasks they make due.
        Per result, what was written for its task (itself, or the run's failure when the store
        refused it) and whether the store applied it."""
        dispatch = self.dispatch
        claim = dispatch.activity_claim() if dispatch is not None else None
        if dispatch is None or claim is None:
            left.update(EVERYTHING)
            return self._told(
                results, write_workflow_results(self._store, results, now, self._on_written, self._give_back)
            )
        try:
            applied, claimed = self._store.complete_workflow_tasks_then_claim(results, now, claim)
        except BaseException as exc:
            dispatch.activities_claimed(claim, [])  # frees the reservation
            if not isinstance(exc, StoreWriteError):
                raise
            left.update(EVERYTHING)  # the pollers claim what the split writes make due
            return self._told(
                results, write_workflow_results(self._store, results, now, self._on_written, self._give_back)
            )
        # the workers learn what was written before the claimed attempts run: an attempt that
        # ends at once then finds its run's executor cached (dex.app.workflows.answers)
        try:
            self._told(results, [(result, ok) for (_task, result), ok in zip(results, applied, strict=True)])
        finally:
            dispatch.activities_claimed(claim, claimed)  # runs them
        written = [result for (_task, result), ok in zip(results, applied, strict=True) if ok]
        if len(claimed) < sum(len(r.activity_tasks) for r in written):
            left.add(ACTIVITY)  # activity tasks we had no room for
            if len(claimed) < claim.limit:
                left.add(SCHEDULING)  # or that were not made claimable: the scheduler was busy
        if any(r.child_runs or r.messages for r in written):
            # other runs (children, parents) got work; a child that needs its concurrency key,
            # or a dispatch that found the scheduler busy, waits for the scheduler
            left.update((WORKFLOW, SCHEDULING))
        if claimed:
            self._telemetry.tasks_claimed("activity", len(claimed))
        return [(result, ok) for (_task, result), ok in zip(results, applied, strict=True)]

    def _told(
        self, results: list[tuple[WorkflowTask, WorkflowTaskResult]], written: list[tuple[WorkflowTaskResult, bool]]
    ) -> list[tuple[WorkflowTaskResult, bool]]:
        """Tell ``on_written`` what was written for each task (itself, or what replaced it) and
        whether it applied; ``written`` comes back."""
        if self._on_written is not None:
            for (task, _result), (result, ok) in zip(results, written, strict=True):
                self._on_written(task, result, ok)
        return written

    def _count_discarded(
        self, kind: str, tasks: Sequence[WorkflowTask | ActivityTask], applied: Sequence[bool]
    ) -> None:
        lost = 0
        for task, ok in zip(tasks, applied, strict=True):
            # an answered step the store declined lost no lease: its outcome goes the ordinary way
            if not ok and not isinstance(task, AnsweredStep):
                lost += 1
                log.warning("discarded the result of %s task %s: not applied; it is done again", kind, task.task_id)
        if lost:
            self.discarded += lost
            self._telemetry.leases_lost(kind, lost)


def _lease_key(task: ActivityTask) -> tuple[int, int]:
    # a task keeps its id across claims; the lease version tells this claim's attempt apart
    return task.task_id, task.lease.version
