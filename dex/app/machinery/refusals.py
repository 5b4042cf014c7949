"""Writes the store refuses: find the refused item of a batch, settle it alone, write the rest.

The buffer writes task results, activity outcomes, events and heartbeats in batches. When the
store refuses a batch for the data in it (:class:`~dex.app.ports.store.StoreRejectedError`: a value
it cannot hold), sending the same batch again would fail forever and hold up every run whose
result is in it. So a refused batch is split in halves, each written on its own, down to the
single items the store refuses (:func:`bisect`); each of those is settled by what it is:

- a workflow result: the run ends FAILED with the store's reason ("the store refused this
  task's result: ..."), its parent told and the children it would have cancelled cancelled;
  if even that is refused, the task is given back to be retried later (``retry_later``);
- an activity outcome: the attempt fails for good with the reason (the workflow code may catch
  it); if even that is refused, the outcome is dropped and the attempt is retried when its
  lease lapses;
- an event: its sender gets the StoreRejectedError (see ``ResultBuffer._write_messages``);
- a heartbeat: dropped.

A batch the store answers with another error for its data (:class:`~dex.app.ports.store.StoreWriteError`:
a statement that fails for one item's shape, a bug rather than a value that cannot be held) is
split the same way, so that the healthy items are written at once; the item that fails alone
is not failed but retried alone, with a backoff: a workflow result's task is given back
(``retry_later``: ``TASK_RETRY``'s backoff, growing with the task's lease version, at most 5
minutes), an activity attempt is retried as the same attempt after that backoff
(:func:`retried_later`), an event's sender gets the error, a heartbeat is dropped. It never
holds the other runs, and never spins.

A store that is unavailable is another matter: any other exception goes up, and the buffer
keeps the whole batch for its next flush (with the flusher's backoff): splitting a batch that
fails for a reason outside it would write nothing and cost more writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

import attrs

from dex.app.machinery.backoff import TASK_RETRY
from dex.app.ports.store import ActivityOutcome, AnsweredStep, Store, StoreRejectedError, StoreWriteError, WorkflowTask
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import OutgoingMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo

log = logging.getLogger("dex.buffer")

T = TypeVar("T")

# called with a task whose result could not be written, the result, and whether it was applied
OnWritten = Callable[[WorkflowTask, WorkflowTaskResult, bool], None]
# gives a workflow task back to be retried later (WorkflowWorker.retry_later)
GiveBack = Callable[[WorkflowTask, str, BaseException | None], bool]


def bisect(
    items: list[T], write: Callable[[list[T]], list[bool]], refused: Callable[[T, StoreWriteError], bool]
) -> list[bool]:
    """``write(items)``; when the store answers the batch with an error for its data
    (``StoreWriteError``: refused data, or a statement that failed for it), each half is
    written on its own, down to the single items that fail, which ``refused`` settles (whether
    something of it was applied). A store that is unavailable raises through: the caller keeps
    the whole batch for the next flush (halves written already are repeats then, which their
    lease checks discard). A batch of n with one failing item costs about 2·log2(n) writes; one
    whose every item fails (a store that fails every write alike for its data) 2n - 1."""
    try:
        return write(items)
    except StoreWriteError as exc:
        if len(items) == 1:
            return [refused(items[0], exc)]
        log.info("the store failed a batch of %d writes for its data (%s); writing its halves apart", len(items), exc)
        half = len(items) // 2
        return bisect(items[:half], write, refused) + bisect(items[half:], write, refused)


def write_activity_outcomes(store: Store, outcomes: list[ActivityOutcome], now: datetime) -> list[bool]:
    """Write activity outcomes; an outcome the store refuses fails its activity for good, one
    it fails otherwise is retried as the same attempt after a backoff."""

    def refused(outcome: ActivityOutcome, exc: StoreWriteError) -> bool:
        task = outcome.task
        if not isinstance(exc, StoreRejectedError):
            return retried_later(store, outcome, exc, now)
        reason = refusal_reason(exc)
        log.error(
            "the store refused the outcome of activity %s of run %s, attempt %d: %s; the activity fails",
            task.name,
            task.run_id,
            task.attempt,
            reason,
            extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
        )
        failure = FailureInfo(
            type=StoreRejectedError.__name__,
            message=f"the store refused this activity attempt's outcome: {reason}",
            terminal=True,
        )
        try:
            return store.complete_activity_tasks([ActivityOutcome(task=task, failure=failure)], now)[0]
        except StoreWriteError:
            log.error("the store refused the failure too; the attempt is retried when its lease lapses")
            return False

    return bisect(outcomes, lambda part: store.complete_activity_tasks(part, now), refused)


def retried_later(store: Store, outcome: ActivityOutcome, exc: StoreWriteError, now: datetime) -> bool:
    """An activity outcome the store fails alone (not a refused value): the attempt is retried
    as the same attempt (``counts=False``) after ``TASK_RETRY``'s backoff for the claims that
    did not count, without jitter (the buffer draws no randomness: the simulator replays it);
    if even that is not written, the outcome is dropped and the attempt runs again when its
    lease lapses."""
    task = outcome.task
    uncounted = max(1, task.lease.version - task.attempt + 1)  # claims of this task less its attempts
    delay = min(TASK_RETRY.base_delay(uncounted), TASK_RETRY.max_delay)
    log.error(
        "the store failed the outcome of activity %s of run %s, attempt %d (%s); the attempt is retried in %.0f s",
        task.name,
        task.run_id,
        task.attempt,
        refusal_reason(exc),
        delay.total_seconds(),
        extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
    )
    try:
        return store.complete_activity_tasks([ActivityOutcome(task=task, retry_at=now + delay, counts=False)], now)[0]
    except StoreWriteError:
        log.error("the store failed the retry too; the attempt is retried when its lease lapses")
        return False


@attrs.define
class PendingMessage:
    """An event on its way to a run's inbox; its sender waits for ``written``."""

    run_id: str
    message: ev.Message
    written: threading.Event = attrs.Factory(threading.Event)
    error: BaseException | None = None


def write_messages(store: Store, messages: list[PendingMessage], now: datetime) -> None:
    """Write events and tell each sender how it went; the sender of an event the store
    refuses (or fails otherwise for its data) gets the StoreWriteError, the others' events are
    written."""
    try:
        errors: Sequence[BaseException | None] = store.send_messages([(p.run_id, p.message) for p in messages], now)
    except StoreWriteError as exc:
        if len(messages) == 1:
            errors = [exc]
        else:
            half = len(messages) // 2
            write_messages(store, messages[:half], now)
            write_messages(store, messages[half:], now)
            return
    for pending, error in zip(messages, errors, strict=True):
        pending.error = error
        pending.written.set()


def write_workflow_results(
    store: Store,
    results: list[tuple[WorkflowTask, WorkflowTaskResult]],
    now: datetime,
    on_written: OnWritten | None,
    give_back: GiveBack | None,
) -> list[tuple[WorkflowTaskResult, bool]]:
    """Write workflow results; per result, what was written for its task (itself, or its run's
    failure when the store refused it) and whether the store applied it. A result the store
    fails otherwise for its data has its task given back, to be retried after a backoff."""
    written: dict[int, WorkflowTaskResult] = {}  # id() of a refused item -> what replaced it

    def refused(item: tuple[WorkflowTask, WorkflowTaskResult], exc: StoreWriteError) -> bool:
        # a result that can never be written would be retried forever: the run fails with the
        # reason instead; if even that is refused, the task is given back for later
        task, result = item
        reason = refusal_reason(exc)
        if isinstance(task, AnsweredStep):
            # no run fails of it here: the step's outcome goes the ordinary way (on_written), and
            # the run's workflow task meets the refusal, if it recurs, with a task of its own
            log.warning("the store refused an answered step of run %s (%s)", task.run_id, reason)
            return False
        if not isinstance(exc, StoreRejectedError):
            # not a value the store cannot hold: most likely a bug (of a statement, of a
            # trigger) that a deploy fixes, so the run does not fail of it; its task is retried
            # alone after a backoff that grows with its claims, out of the other runs' way
            # (on_written closes the executor that decided it: the retry decides again)
            if give_back is None or not give_back(task, f"the store failed its result: {reason}", exc):
                log.error(
                    "the store failed the result of workflow task %s of run %s (%s) and it could not be "
                    "given back; its lease will lapse",
                    task.task_id,
                    task.run_id,
                    reason,
                    extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
                )
            return False
        log.error(
            "the store refused the result of workflow task %s of run %s: %s; the run fails",
            task.task_id,
            task.run_id,
            reason,
            extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
        )
        failure = FailureInfo(
            type=StoreRejectedError.__name__, message=f"the store refused this task's result: {reason}", terminal=True
        )
        failed = failure_instead(store, task, result, failure, now)
        if on_written is not None:
            on_written(task, result, False)  # the executor that decided the refused result is closed
        try:
            applied = store.complete_workflow_tasks([(task, failed)], now)[0]
        except StoreWriteError as again:
            if give_back is None or not give_back(task, "the store refused its result", again):
                log.error("could not give back workflow task %s; its lease will lapse", task.task_id)
            return False
        written[id(item)] = failed
        return applied

    applied = bisect(results, lambda part: store.complete_workflow_tasks(part, now), refused)
    return [(written.get(id(item), item[1]), ok) for item, ok in zip(results, applied, strict=True)]


def failure_instead(
    store: Store, task: WorkflowTask, refused: WorkflowTaskResult, failure: FailureInfo, now: datetime
) -> WorkflowTaskResult:
    """The result that ends ``task``'s run FAILED with ``failure`` instead of the ``refused``
    one: its parent is told (a parent waiting for it would wait forever), and the children the
    refused result would have cancelled are cancelled (those it would have created never were).
    The history stays foldable: a run's first task records its RunStarted too."""
    failed = failed_result(
        task.run_id, refused.expected_last_seq, refused.consumed, now, failure, started=refused.started
    )
    never_created = {child.run_id for child in refused.child_runs}
    messages = [
        message
        for message in refused.messages
        if isinstance(message.event, ev.RunCancelled)
        and message.run_id != task.run_id
        and message.run_id not in never_created
    ]
    record = store.get_run(task.run_id)
    if record is not None and record.parent_run_id is not None:
        told = ev.ChildRunFailed(child_run_id=task.run_id, failure=failure)
        messages.append(OutgoingMessage(run_id=record.parent_run_id, event=told, visible_from=now))
    return attrs.evolve(failed, messages=tuple(messages))


def refusal_reason(exc: BaseException, limit: int = 500) -> str:
    """The store's reason for a refusal, as text any store keeps: no NUL, no lone surrogate
    (shown escaped), at most ``limit`` characters."""
    try:
        text = str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - a reason that cannot be had is said so
        text = type(exc).__name__
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failed_result(
    run_id: str, last: int, message_ids: Sequence[int], now: datetime, failure: FailureInfo, *, started: bool = False
) -> WorkflowTaskResult:
    """A result that ends the run FAILED with ``failure``, consuming the given inbox messages;
    with ``started``, the run's first task, which records its RunStarted first."""
    completion = ev.RunCompleted(status=RunStatus.FAILED, failure=failure)
    events: list[ev.Event] = [ev.WorkflowTaskStarted(), completion, ev.WorkflowTaskCompleted()]
    if started:
        events.insert(1, ev.RunStarted())
    return WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last,
        new_events=tuple(
            ev.HistoryEvent(sequence_number=last + i + 1, timestamp=now, event=e) for i, e in enumerate(events)
        ),
        consumed=tuple(message_ids),
        started=started,
        completion=completion,
    )
