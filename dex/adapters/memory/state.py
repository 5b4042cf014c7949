"""The in-memory adapter's tables, and the row operations its parts share.

:class:`MemoryState` holds every table of the in-memory store (runs, inboxes, workflow and
activity tasks, queues, the leader) behind one re-entrant lock, and the operations on rows
that more than one part needs: inserting a run, delivering a message, adding a workflow task,
finding a queue. The ports themselves are implemented in ``runs.py`` (runs and messages),
``tasks.py`` (workflow and activity tasks) and ``store.py`` (the adapter, eager dispatch,
queues and leadership).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dex.adapters.memory.tables import QUEUED, ActivityTaskRow, InboxRow, QueueRow, RunRow, WorkflowTaskRow
from dex.app.clock import SystemClock
from dex.app.ports import QUEUE_KINDS, WORKFLOW, Clock, queue_capacity
from dex.app.schedule_ports import ScheduleRecord
from dex.domain import events as ev
from dex.domain.definitions import validate_queue
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus


class MemoryState:
    """The tables of one in-memory store and the row operations its parts share."""

    def __init__(self, clock: Clock | None = None, *, transaction_connection: Callable[[], Any] | None = None) -> None:
        if connection_factory_error := _factory_error(transaction_connection):
            raise TypeError(connection_factory_error)
        self._clock: Clock = clock if clock is not None else SystemClock()
        # where transaction steps get their connection (store.py); None: they fail, saying so
        self._transaction_connection = transaction_connection
        self._step_lock = threading.RLock()  # steps run one at a time: one shared connection serves all
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._runs: dict[str, RunRow] = {}
        self._inbox: dict[str, list[InboxRow]] = {}
        self._workflow_tasks: dict[int, WorkflowTaskRow] = {}
        self._workflow_task_of_run: dict[str, int] = {}
        self._activity_tasks: dict[int, ActivityTaskRow] = {}
        self._queues: dict[tuple[str, str], QueueRow] = {}
        self._leader: tuple[str, datetime] | None = None
        self._schedules: dict[str, ScheduleRecord] = {}

    @property
    def clock(self) -> Clock:
        return self._clock

    def close(self) -> None:
        pass

    def _find_live_instance(self, instance_id: str | None) -> str | None:
        if instance_id is None:
            return None
        for row in self._runs.values():
            if row.created.instance_id == instance_id and not row.status.is_terminal:
                return row.run_id
        return None

    def _insert_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> None:
        if run_id in self._runs:
            raise ValueError(f"run {run_id} exists already")
        self.ensure_queue(created.queue, WORKFLOW)
        row = RunRow(run_id=run_id, position=next(self._ids), created=created, status=RunStatus.CREATED, created_at=now)
        row.history.append(ev.HistoryEvent(sequence_number=1, timestamp=now, event=created))
        self._runs[run_id] = row
        self._inbox[run_id] = []
        self._push(run_id, ev.RunStarted(), now)

    def _push(self, run_id: str, message: ev.Message, visible_from: datetime) -> int:
        message_id = next(self._ids)
        self._inbox[run_id].append(
            InboxRow(message_id=message_id, run_id=run_id, event=message, visible_from=visible_from)
        )
        return message_id

    def _deliver(self, run_id: str, message: ev.Message, visible_from: datetime) -> None:
        """Put a message in a live run's inbox; messages for finished or unknown runs are dropped."""
        row = self._runs.get(run_id)
        if row is not None and not row.status.is_terminal:
            self._push(run_id, message, visible_from)

    def _live_run(self, run_id: str) -> RunRow:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        if row.status.is_terminal:
            raise InvalidStateError(f"run {run_id} has ended ({row.status.value})")
        return row

    def _add_workflow_task(self, run: RunRow, queue: str) -> WorkflowTaskRow:
        task = WorkflowTaskRow(
            task_id=next(self._ids),
            run_id=run.run_id,
            workflow_name=run.created.workflow_name,
            queue=queue,
            priority=run.created.priority,
        )
        self._workflow_tasks[task.task_id] = task
        self._workflow_task_of_run[run.run_id] = task.task_id
        return task

    def _active_workflow_tasks(self, queue: str) -> int:
        return sum(1 for t in self._workflow_tasks.values() if t.queue == queue)

    def _queued_activity_tasks(self, queue: str) -> int:
        return sum(1 for t in self._activity_tasks.values() if t.queue == queue and t.state == QUEUED)

    def _queue(self, name: str, kind: str) -> QueueRow:
        queue = self._queues.get((name, kind))
        if queue is None:
            queue = self._queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=100)
        return queue

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        check_queue(name, kind, capacity)
        with self._lock:
            if (name, kind) not in self._queues:
                self._queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=capacity)


def check_queue(name: str, kind: str, capacity: int) -> None:
    """Refuse a queue name, kind or capacity that no queue can have."""
    validate_queue(name)
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    queue_capacity(capacity)


def _factory_error(factory: object) -> str | None:
    if factory is None or callable(factory):
        return None
    return f"transaction_connection must be a callable returning a connection, or None, got {type(factory).__name__}"
