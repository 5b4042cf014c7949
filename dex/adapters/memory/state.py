"""The in-memory adapter's tables, and the row operations its parts share.

:class:`MemoryState` holds every table of the in-memory store (runs, inboxes, workflow and
activity tasks, queues) behind one re-entrant lock, and the operations on rows
that more than one part needs: inserting a run, delivering a message, adding a workflow task,
finding a queue. The ports themselves are implemented by the parts that receive it: ``runs.py``
(runs and messages), ``tasks.py`` (workflow and activity tasks), ``forks.py``, ``schedules.py``,
``queues.py`` (queue administration, leadership) and ``steps.py`` (transaction steps);
``store.py`` puts them together as the adapter.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from datetime import datetime

import attrs

from dex.adapters.memory.tables import (
    QUEUED,
    ActivityTaskRow,
    InboxRow,
    PublishedRow,
    QueueRow,
    RunRow,
    StreamRow,
    WorkflowTaskRow,
)
from dex.app.ports.attempts import FAILED, LOST, recorded
from dex.app.ports.store import QUEUE_KINDS, WORKFLOW, FailedAttempt, StepAttempts, queue_capacity
from dex.domain import events as ev
from dex.domain.definitions import validate_queue
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.domain.task import UpdateAnswer


class MemoryState:
    """The tables of one in-memory store and the row operations its parts share.

    Every part of the adapter receives the same state and holds ``lock`` (re-entrant: a part's
    operation may call another's) while it reads or changes a table, which makes each port call
    atomic, as a transaction is in PostgreSQL."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ids = itertools.count(1)  # one sequence for runs' positions, messages and tasks
        self.runs: dict[str, RunRow] = {}
        self.inbox: dict[str, list[InboxRow]] = {}
        self.workflow_tasks: dict[int, WorkflowTaskRow] = {}
        self.workflow_task_of_run: dict[str, int] = {}
        self.activity_tasks: dict[int, ActivityTaskRow] = {}
        self.queues: dict[tuple[str, str], QueueRow] = {}
        # per run, per step (created_seq): its failed and lost attempts (ports/attempts.py)
        self.attempts: dict[str, dict[int, StepAttempts]] = {}
        # engine.update's answers by (run, update id), and the condition their callers wait on
        self.update_answers: dict[tuple[str, str], UpdateAnswer] = {}
        self.answered = threading.Condition(self.lock)
        # per run, by key: published values and streams (docs/reference/contract.md §14; streams.py)
        self.published: dict[str, dict[str, PublishedRow]] = {}
        self.streams: dict[str, dict[str, StreamRow]] = {}

    def keep_answers(self, run_id: str, answers: Iterable[UpdateAnswer]) -> None:
        """Keep ``answers`` for the callers of ``engine.update`` and wake them (the caller holds
        the lock). A rejection never replaces an answer: an accepted update's answer is final."""
        kept = False
        for answer in answers:
            known = self.update_answers.get((run_id, answer.update_id))
            if known is None or known.rejected:
                self.update_answers[(run_id, answer.update_id)] = answer
                kept = True
        if kept:
            self.answered.notify_all()

    def record_attempt(self, run_id: str, created_seq: int, failed: FailedAttempt, next_attempt: int) -> None:
        """Keep a failed or lost attempt of a step (the caller holds the lock and writes the
        retry or the claim that found it)."""
        steps = self.attempts.setdefault(run_id, {})
        known = steps.get(created_seq, StepAttempts(created_seq=created_seq))
        steps[created_seq] = attrs.evolve(
            known,
            failed=known.failed + (failed.kind == FAILED),
            lost=known.lost + (failed.kind == LOST),
            next_attempt=next_attempt,
            recent=recorded(known.recent, failed),
        )

    def find_live_instance(self, instance_id: str | None) -> str | None:
        if instance_id is None:
            return None
        for row in self.runs.values():
            if row.created.instance_id == instance_id and not row.status.is_terminal:
                return row.run_id
        return None

    def insert_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> None:
        if run_id in self.runs:
            raise ValueError(f"run {run_id} exists already")
        self.ensure_queue(created.queue, WORKFLOW)
        row = RunRow(run_id=run_id, position=next(self.ids), created=created, status=RunStatus.CREATED, created_at=now)
        row.history.append(ev.HistoryEvent(sequence_number=1, timestamp=now, event=created))
        self.runs[run_id] = row
        self.inbox[run_id] = []
        self.push(run_id, ev.RunStarted(), now)

    def push(self, run_id: str, message: ev.Message, visible_from: datetime) -> int:
        message_id = next(self.ids)
        self.inbox[run_id].append(
            InboxRow(message_id=message_id, run_id=run_id, event=message, visible_from=visible_from)
        )
        return message_id

    def deliver(self, run_id: str, message: ev.Message, visible_from: datetime) -> None:
        """Put a message in a live run's inbox; messages for finished or unknown runs are dropped."""
        row = self.runs.get(run_id)
        if row is not None and not row.status.is_terminal:
            self.push(run_id, message, visible_from)

    def live_run(self, run_id: str) -> RunRow:
        row = self.runs.get(run_id)
        if row is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        if row.status.is_terminal:
            raise InvalidStateError(f"run {run_id} has ended ({row.status.value})")
        return row

    def add_workflow_task(self, run: RunRow, queue: str) -> WorkflowTaskRow:
        task = WorkflowTaskRow(
            task_id=next(self.ids),
            run_id=run.run_id,
            workflow_name=run.created.workflow_name,
            queue=queue,
            priority=run.created.priority,
        )
        self.workflow_tasks[task.task_id] = task
        self.workflow_task_of_run[run.run_id] = task.task_id
        return task

    def active_workflow_tasks(self, queue: str) -> int:
        return sum(1 for t in self.workflow_tasks.values() if t.queue == queue)

    def queued_activity_tasks(self, queue: str) -> int:
        return sum(1 for t in self.activity_tasks.values() if t.queue == queue and t.state == QUEUED)

    def queue(self, name: str, kind: str) -> QueueRow:
        queue = self.queues.get((name, kind))
        if queue is None:
            queue = self.queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=100)
        return queue

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        check_queue(name, kind, capacity)
        with self.lock:
            if (name, kind) not in self.queues:
                self.queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=capacity)


def check_queue(name: str, kind: str, capacity: int) -> None:
    """Refuse a queue name, kind or capacity that no queue can have."""
    validate_queue(name)
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    queue_capacity(capacity)
