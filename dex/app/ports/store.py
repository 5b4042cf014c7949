"""Ports: what the engine needs from a store, in domain terms.

Each adapter (in-memory, PostgreSQL) implements every protocol here. The methods are whole
domain operations (create a run, claim workflow tasks, complete them), never single queries,
so that an adapter is free to do each in one transaction or one lock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import attrs

from dex.app.ports.attempts import MAX_RECENT_ATTEMPTS as MAX_RECENT_ATTEMPTS
from dex.app.ports.attempts import FailedAttempt as FailedAttempt
from dex.app.ports.attempts import PendingAttempt as PendingAttempt
from dex.app.ports.attempts import StepAttempts as StepAttempts
from dex.app.ports.attempts import StepEndings as StepEndings
from dex.app.ports.endings import RunEndings
from dex.app.ports.engines import EngineRegistry
from dex.app.ports.instance_keys import KeyedStarts
from dex.app.ports.schedules import ScheduleStore
from dex.app.ports.streams import StreamStore

# the task records live in their own module, so that the transaction-step port names them too
from dex.app.ports.tasks import DEFAULT_ACTIVITY_LEASE as DEFAULT_ACTIVITY_LEASE
from dex.app.ports.tasks import ActivityOutcome as ActivityOutcome
from dex.app.ports.tasks import ActivityTask as ActivityTask
from dex.app.ports.tasks import AnsweredStep as AnsweredStep
from dex.app.ports.tasks import Lease as Lease
from dex.app.ports.tasks import WorkflowTask as WorkflowTask
from dex.app.ports.transactions import StepFailed as StepFailed
from dex.app.ports.transactions import TransactionStep as TransactionStep
from dex.app.ports.transactions import TransactionSteps as TransactionSteps
from dex.app.ports.updates import UpdateAnswers
from dex.domain import events as ev
from dex.domain.errors import DexError
from dex.domain.forks import Fork
from dex.domain.queue_limits import RateLimit
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, UpdateAnswer, WorkflowTaskResult
from dex.domain.values import FailureInfo, Payload

WORKFLOW = "workflow"
ACTIVITY = "activity"
QUEUE_KINDS = (WORKFLOW, ACTIVITY)


MAX_QUEUE_CAPACITY = 2**31 - 1  # the largest a queue's capacity column (a PostgreSQL integer) holds


def queue_capacity(capacity: int) -> int:
    """``capacity`` if a queue can have it (an int from 1 to ``MAX_QUEUE_CAPACITY``), else a
    ValueError naming the range: every store refuses the same values, before any write."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= MAX_QUEUE_CAPACITY:
        raise ValueError(f"queue capacity must be an int from 1 to {MAX_QUEUE_CAPACITY}, got {capacity!r:.60}")
    return capacity


def queue_kind(kind: str) -> str:
    """``kind`` if it is a queue kind, else ValueError."""
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    return kind


class UnreadableHistoryError(Exception):
    """A store found rows of a run that it cannot decode (corrupted, or written by a newer dex).

    Carries what a worker needs to fail that run cleanly: the last sequence number and the
    ids of the visible inbox messages, so the run ends FAILED instead of blocking its worker.
    """

    def __init__(self, run_id: str, last_seq: int, message_ids: Sequence[int], detail: str) -> None:
        super().__init__(f"the history of run {run_id} cannot be read: {detail}")
        self.run_id, self.last_seq, self.message_ids, self.detail = run_id, last_seq, tuple(message_ids), detail


class StoreWriteError(Exception):
    """The store answered a write with an error for the data of this batch, one it does not
    class as refused data (:class:`StoreRejectedError`, a subclass): a statement that failed
    for the shape of one item (a bug of the adapter's statements, a trigger of the database's
    that raises), as opposed to being unavailable (``ConnectionError``, a timeout, a server
    shutting down, anything else).

    Sending the same batch again would most likely fail the same way and hold every other run
    whose result is in it, so the buffer splits the batch until the item that fails is found;
    that item is retried alone, with a backoff (its workflow task given back, its activity
    attempt retried as the same attempt), not failed: a fix deployed or a trigger dropped lets
    it through. Adapters raise it for the writes the buffer makes (completions, messages,
    heartbeats); the buffer keeps a batch whole on any other exception.
    """


class StoreRejectedError(StoreWriteError):
    """The store refused the data of a write (a value it cannot hold: an encoding, a range, a
    constraint), as opposed to being unavailable (``ConnectionError``, a timeout, anything else).

    Sending the same data again fails the same way, so a batch that gets this is split until
    the item it refuses is found, and only that item's task or run bears it (``ResultBuffer``):
    the data can never be written, so the run fails (an activity attempt fails) with the
    reason; a store that is unavailable keeps the whole batch for the next flush instead.
    Adapters raise it for the writes the buffer makes (completions, messages, heartbeats).
    """


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, UTC and aware."""
        ...


@attrs.frozen(kw_only=True)
class RunRecord:
    """A run as the store keeps it."""

    run_id: str
    workflow_name: str
    queue: str
    status: RunStatus
    instance_id: str | None
    priority: int
    concurrency_key: str | None
    labels: ev.Labels
    parent_run_id: str | None
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    custom_status: str | None = None
    result: Payload | None = None
    failure: FailureInfo | None = None
    code_version: str | None = None
    task_failure: FailureInfo | None = None  # why its workflow task keeps failing (a held run)
    forked_from: str | None = None  # the run this one is a fork of (docs/reference/contract.md §11)
    # docs/reference/contract.md §14: when the run is cancelled with reason "timeout"; events it never read
    deadline: datetime | None = None
    unread_events: int = 0


@attrs.frozen(kw_only=True)
class RunFilter:
    workflow_name: str | None = None
    statuses: frozenset[RunStatus] | None = None
    labels: ev.Labels = ()
    instance_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    limit: int = 100
    code_version: str | None = None
    # only the children of this run (``RunRecord.parent_run_id``)
    parent_run_id: str | None = None
    # only runs that are no run's child (the dashboard's runs list, which nests children)
    top_level: bool = False


@attrs.frozen(kw_only=True)
class Claim:
    """A claim made in the same transaction as a completion ("complete, then claim").

    A completion that makes work due (activity tasks, messages to runs) may claim up to
    ``limit`` tasks named in ``names`` for ``owner`` before it commits, under the ordinary
    claim rules (priority, pause, capacity, ``SKIP LOCKED``): the engine that wrote the
    completion runs the next step at once, without a claim transaction or a poll interval of
    its own. ``lease`` is the claimed tasks' lease: a workflow task's, or an activity task's
    (at most its ``lock_timeout``, as in :meth:`ActivityTaskQueue.claim_activity_tasks`).
    """

    names: frozenset[str]
    owner: str
    limit: int
    lease: timedelta = timedelta(seconds=10)
    # workflow claims only: also load each claimed task's input in the same transaction, the
    # history from the sequence number given for its run (0, or absent: all of it)
    after_seqs: Mapping[str, int] | None = None


@attrs.frozen(kw_only=True)
class WorkflowInput:
    """A claimed workflow task's input: the run's history events from the sequence number the
    load asked for (all of them from 0), and its inbox messages visible at the load's time, in
    the order they became visible."""

    events: list[ev.HistoryEvent]
    inbox: list[InboxMessage]


# a claimed workflow task's input as load_workflow_tasks gives it, or the error that stands for
# it (RunNotFoundError, UnreadableHistoryError): a value, so one task's failure is its own
Loaded = WorkflowInput | Exception


@attrs.frozen(kw_only=True)
class QueueInfo:
    """A task queue: ``kind`` is "workflow" or "activity"; ``status`` "ACTIVE" or "PAUSED";
    ``key_concurrency`` and ``rate_limit`` as :mod:`dex.domain.queue_limits` states them."""

    name: str
    kind: str
    status: str
    capacity: int
    depth: int
    key_concurrency: int = 1
    rate_limit: RateLimit | None = None


@attrs.frozen(kw_only=True)
class ActivitySlots:
    """An activity queue's slots as its scheduler counts them: ``held`` is the number of its
    tasks that hold one (scheduled, claimable or running; not those waiting to be scheduled,
    nor retries waiting for their delay). Whether an inline attempt may run (:mod:`dex.app.workflows.inline`).
    ``paused`` is also true of a queue with a rate limit: each of its starts is a claim, which
    takes a start slot, so none of its attempts runs inline."""

    queue: str
    paused: bool
    capacity: int
    held: int


class RunStore(Protocol):
    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        """Create a run (history ``[RunCreated]``, inbox ``[RunStarted]``) and return its id.

        When a non-terminal run has the same ``instance_id``, create nothing and return its id.
        """
        ...

    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        """``create_run``, and in the same transaction, when the run may be scheduled at once
        (no concurrency key, its queue active with a free slot, its workflow among
        ``claim.names``, no scheduler at work), create its first workflow task already claimed
        for ``claim.owner``; the claimed task comes back with the id, and with its input as
        ``load_workflow_tasks`` would give it (the run's history ``[RunCreated]``, its inbox
        ``[RunStarted]``), so it runs without a load (else the scheduler schedules the run as
        usual, and both lists are empty)."""
        ...

    def create_fork(self, fork: Fork, now: datetime) -> str:
        """Create the run ``fork`` describes (docs/reference/contract.md §11), all or nothing, and return its id: a run
        created as ``create_run`` creates one, its ``forked_from`` set; for a started fork, then
        ``fork.first_task(...)`` applied as a workflow task's result is (its history, status
        RUNNING, its activity tasks, timers and children). InvalidStateError, and nothing
        written, when a live run holds the fork's instance id."""
        ...

    def get_run(self, run_id: str) -> RunRecord | None: ...

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        """The runs among ``run_ids`` that exist, in one read (in no particular order)."""
        ...

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        """Runs matching the filter, newest first."""
        ...

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]: ...

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        """At most ``limit`` events of the run's history with sequence numbers above
        ``after_seq``, oldest first, reading little more than those (a page of a long history).
        RunNotFoundError if there is no such run."""
        ...

    def history_bounds(self, run_id: str) -> tuple[int, int]:
        """The sequence numbers of the first and the last event of the run's stored history (one
        generation, numbered consecutively: a page of it is found by arithmetic), read without
        its events. RunNotFoundError if there is no such run."""
        ...

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        """Put a message in a run's inbox. RunNotFoundError / InvalidStateError (terminal run)."""
        ...

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        """Put each message in its run's inbox, as one batch; per item, None or the error
        ``send_message`` would raise (RunNotFoundError, InvalidStateError)."""
        ...

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        """Check ``target`` against the run's status and put ``message`` in its inbox.

        SUSPENDED and RUNNING (resume) take effect on the status at once; CANCELLED takes
        effect when the run's workflow task processes the message.
        """
        ...


class WorkflowTaskQueue(Protocol):
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        """Create workflow tasks for runs with visible messages (capacity, pause and
        concurrency keys permitting); return how many were created."""
        ...

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]: ...

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        """The run's history events with ``sequence_number >= after_seq`` (all of it for 0), and
        its inbox messages visible at ``now`` in the order they became visible.

        A worker that holds the run's executor up to ``after_seq`` asks for just that event:
        getting exactly it back proves nothing happened since. RunNotFoundError when the run
        is gone; UnreadableHistoryError when a row cannot be decoded.
        """
        ...

    def load_workflow_tasks(self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime) -> list[Loaded]:
        """``load_workflow_task`` for a claimed batch at once, each with its own ``after_seq``;
        per task its history and inbox, or the RunNotFoundError / UnreadableHistoryError."""
        ...

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        """Apply each result while its lease holds and its history is unchanged; False: discarded.

        A result whose task is an :class:`AnsweredStep` (an activity's outcome applied by the
        engine holding the run's executor) applies only under the conditions that class names,
        and then deletes the activity task; when they do not hold, nothing of it is written
        (False) and its activity task stays as it was."""
        ...

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        """``complete_workflow_tasks``, then, in the same transaction, make the activity tasks
        it created claimable (the scheduler's rules permitting) and claim activity tasks for
        ``claim.owner``; the claimed tasks come back with the applied flags."""
        ...

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        """Give claimed tasks back without a result, each to be claimed again from its
        ``datetime`` on (a task that failed for a reason other than its workflow code: the
        store, a bug of dex, code that blocked). Only while the lease is still the caller's;
        the lease's version moves on, so a late result of this claim is discarded. Per task:
        whether it was given back (False: the lease was lost already). With ``failure`` (a run
        held: its history does not match its code, docs/reference/contract.md §11), each given-back task's run keeps
        it as ``RunRecord.task_failure`` until a result of its is applied."""
        ...


class ActivityTaskQueue(Protocol):
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        """Make visible activity tasks claimable, capacity and pause permitting."""
        ...

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        """Claim up to ``limit`` claimable tasks named in ``names``, each under a lease until
        ``now`` + the shorter of ``lease`` and its ``lock_timeout`` (a task taken over from an
        expired lease counts as its next attempt). The engine keeps extending the short lease
        while the attempt runs (:class:`dex.app.activities.leases.ActivityLeases`)."""
        ...

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        """Each task as it stands now, with its current lease, in the order asked; None for a
        task that is not claimed (waiting for its first attempt or a retry) or is gone
        (completed, or its run ended). A remote worker's calls name a task by its id and lease
        version (docs/reference/contract.md §13): this read finds the rest, and the write that follows checks the
        lease again under its lock."""
        ...

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        """Heartbeats: push each lease to ``now`` + the shorter of ``lease`` and its
        ``lock_timeout``, if its claim still holds it; per task, whether it did."""
        ...

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        """Apply each outcome while its lease holds; False: discarded."""
        ...

    def complete_activity_tasks_then_claim(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        """``complete_activity_tasks``, then, in the same transaction, schedule workflow tasks
        for the runs it sent messages to (the scheduler's rules permitting) and claim workflow
        tasks for ``claim.owner`` under ``claim.lease``; with ``claim.after_seqs``, also
        ``load_workflow_tasks`` for the claimed tasks (one input per task), else no inputs."""
        ...


class QueueAdmin(Protocol):
    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        """Create the queue if it does not exist (idempotent)."""
        ...

    def create_queue(
        self, name: str, kind: str, capacity: int, key_concurrency: int = 1, rate_limit: RateLimit | None = None
    ) -> None:
        """Create the queue, or give the existing one these settings (all of them)."""
        ...

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None: ...

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None: ...

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None: ...

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: RateLimit | None) -> None:
        """Set or (with None) remove the queue's rate limit; its start slots are made or dropped
        to match (:mod:`dex.domain.queue_limits`)."""
        ...

    def list_queues(self) -> list[QueueInfo]: ...

    def activity_slots(self) -> list[ActivitySlots]:
        """Every activity queue's slots: its capacity, and how many of them its tasks hold."""
        ...


class Leadership(Protocol):
    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the leadership lease; True while this node leads."""
        ...

    def release_leadership(self, node_id: str) -> None: ...


class Maintenance(Protocol):
    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` terminal runs completed before the cut-off (with history)."""
        ...

    def next_due_time(self, now: datetime) -> datetime | None:
        """The earliest future moment at which a message, task or lease becomes due."""
        ...


class AttemptReads(Protocol):
    def step_attempts(self, run_id: str, created_seqs: Collection[int] | None = None) -> list[StepAttempts]:
        """What the store knows of the attempts of the run's activity steps, by ``created_seq``:
        one record per step that has a task or a failed or lost attempt (a step whose only
        attempt succeeded has neither once its outcome is written: it had one attempt). A read
        only; nothing is written for an attempt that succeeds (:mod:`dex.app.ports.attempts`).
        With ``created_seqs``, only those steps' (a page's steps, of a run with thousands).
        An unknown run has none."""
        ...

    def step_endings(self, run_id: str, created_seqs: Collection[int], after_seq: int, limit: int) -> StepEndings:
        """The outcomes of the run's activity steps scheduled at ``created_seqs`` among the at most
        ``limit`` events after ``after_seq``, reading those events and no others (the steps of a
        page of a long history end anywhere after it: a bounded read finds most of them, and says
        when some may lie beyond it). An unknown run has none (``complete``)."""
        ...


class UpdateDispatch(Protocol):
    def request_update_then_claim(
        self, run_id: str, request: ev.UpdateRequested, now: datetime, claim: Claim
    ) -> tuple[UpdateAnswer | None, list[WorkflowTask], list[Loaded]]:
        """``request_update``, then, in the same transaction, when the request was written,
        schedule the run's workflow task under the scheduler's rules (pause, capacity,
        suspension; a concurrency key only its holder gets at once) and claim workflow tasks for
        ``claim``, with their input loaded from ``claim.after_seqs`` as
        ``complete_activity_tasks_then_claim`` does: the engine that holds the run's executor
        decides the update at once, with no scheduler round and no poll. The claimed tasks and
        their inputs come back with the answer (empty when there was one)."""
        ...


class Store(
    RunStore,
    KeyedStarts,
    AttemptReads,
    WorkflowTaskQueue,
    ActivityTaskQueue,
    TransactionSteps,
    QueueAdmin,
    Leadership,
    Maintenance,
    ScheduleStore,
    EngineRegistry,
    RunEndings,
    UpdateAnswers,
    UpdateDispatch,
    StreamStore,
    Protocol,
):
    """Everything an engine needs from one adapter."""

    @property
    def clock(self) -> Clock: ...

    def close(self) -> None: ...
