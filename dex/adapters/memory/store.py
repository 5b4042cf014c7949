"""InMemoryAdapter: every port of :mod:`dex.app.ports` over Python dicts.

One re-entrant lock serialises all operations, which makes each one atomic just as a
transaction is in PostgreSQL. Iteration orders are fixed (priority, then id), so the same
calls in the same order give the same results: the simulator and hypothesis rely on that.

The adapter is put together from its parts — the tables (``state.py``), runs and messages
(``runs.py``), task queues (``tasks.py``), forks (``forks.py``), schedules (``schedules.py``) — and adds here what spans them: eager dispatch (a
write and the claim that follows it, under one lock), queue administration and leadership.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from dex.adapters.memory import step_connection, storable
from dex.adapters.memory.forks import MemoryForks
from dex.adapters.memory.runs import MemoryRuns
from dex.adapters.memory.schedules import MemorySchedules
from dex.adapters.memory.state import check_queue
from dex.adapters.memory.tables import CREATED, ActivityTaskRow, QueueRow, WorkflowTaskRow
from dex.app.ports import (
    ACTIVITY,
    WORKFLOW,
    ActivityOutcome,
    ActivitySlots,
    ActivityTask,
    Claim,
    Loaded,
    QueueInfo,
    StepFailed,
    TransactionStep,
    WorkflowInput,
    WorkflowTask,
)
from dex.app.transaction_ports import Checkpointed, CheckpointOutcome, StepCheckpoint
from dex.domain import events as ev
from dex.domain.task import InboxMessage, WorkflowTaskResult
from dex.domain.values import TerminalError


class InMemoryAdapter(MemorySchedules, MemoryRuns, MemoryForks):
    """A complete, deterministic store in process memory. Several engines may share one."""

    # -- eager dispatch: a write, then a claim, under one lock ------------------------------------
    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        with self._lock:
            got = self.create_run(run_id, created, now)
            if got != run_id or created.concurrency_key is not None or created.workflow_name not in claim.names:
                return got, [], []
            queue = self._queue(created.queue, WORKFLOW)
            if queue.paused or self._active_workflow_tasks(queue.name) >= queue.capacity:
                return got, [], []
            task = self._add_workflow_task(self._runs[run_id], queue.name)
            task.lease.take(claim.owner, now + claim.lease)
            (started,) = self._inbox[run_id]
            inbox = [InboxMessage(message_id=started.message_id, event=started.event)]
            return got, [task.claimed()], [WorkflowInput(events=list(self._runs[run_id].history), inbox=inbox)]

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        with self._lock:
            applied = self.complete_workflow_tasks(results, now)
            if not any(result.activity_tasks for (_task, result), ok in zip(results, applied, strict=True) if ok):
                return applied, []
            self.schedule_activity_tasks(now, _DISPATCH_BATCH)
            return applied, self.claim_activity_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)

    def complete_activity_tasks_then_claim(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        with self._lock:
            applied = self.complete_activity_tasks(outcomes, now)
            if not any(ok and outcome.retry_at is None for outcome, ok in zip(outcomes, applied, strict=True)):
                return applied, [], []
            self.schedule_workflow_tasks(now, _DISPATCH_BATCH)
            claimed = self.claim_workflow_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)
            if claim.after_seqs is None:
                return applied, claimed, []
            after = claim.after_seqs
            return applied, claimed, self.load_workflow_tasks([(t, after.get(t.run_id, 0)) for t in claimed], now)

    # -- transaction steps (SPEC §9): the factory's connection stands in for the database's ----------
    @property
    def lost_step_slots(self) -> int:
        """Always 0: steps run one at a time here, unwatched (no ``lock_timeout`` ends them)."""
        return 0

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        """Check the lease, run the step's work on a connection of ``transaction_connection``
        (the store's lock is not held meanwhile), then, while the lease still holds, write the
        completion and commit that connection; otherwise roll it back. Steps run one at a time
        (so one shared connection, such as SQLite's ``:memory:``, serves them all). Not atomic
        as on PostgreSQL (a crash between the two commits is not simulated): a testing stand-in."""
        with self._step_lock:
            return self._complete_in_transaction(step)

    def _complete_in_transaction(self, step: TransactionStep) -> bool:
        task = step.task
        if not self._holds(task):
            return False
        conn = self._connection()
        try:
            try:
                if step.async_work is not None and step.run_async is not None:
                    result = step.run_async(step_connection.run_held_async(conn, task.name, step.async_work))
                else:
                    assert step.work is not None
                    result = step_connection.run_held(conn, task.name, step.work)
            except StepFailed as failed:
                raise _without_connection(failed, conn, task.name) from failed.cause
            applied = self.complete_activity_tasks([ActivityOutcome(task=task, result=result)], self._clock.now())[0]
        except BaseException:
            _end(conn, "rollback")
            raise
        _end(conn, "commit" if applied else "rollback")
        return applied

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        """Each step as :meth:`complete_in_transaction` runs one: its work on the factory's
        connection, then, while its workflow task is still held at the expected history, the
        task's result so far written (the task kept) and the step's outcome put in the inbox,
        and the connection committed; a step that failed rolls it back. One commit per step,
        not one per group: a stand-in, like ``complete_in_transaction``."""
        storable.workflow_results([(item.task, item.result) for item in items])
        with self._step_lock:
            return [self._checkpoint(item, now) for item in items]

    def _checkpoint(self, item: StepCheckpoint, now: datetime) -> CheckpointOutcome:
        task = item.task
        with self._lock:
            if not self._holds_workflow_task(task, item.result.expected_last_seq):
                return None
        conn = self._connection()
        try:
            result = step_connection.run_held(conn, item.step.name, item.work)
        except StepFailed as failed:
            _end(conn, "rollback")
            return _without_connection(failed, conn, item.step.name).cause
        except BaseException:
            _end(conn, "rollback")
            raise
        message = ev.ActivityTaskCompleted(created_seq=item.step.created_seq, result=result)
        with self._lock:
            if not self._complete_workflow_task(task, item.result, now, keep=True):
                _end(conn, "rollback")
                return None
            message_id = self._push(task.run_id, message, now)
            last_seq = self._runs[task.run_id].history[-1].sequence_number
        _end(conn, "commit")
        return Checkpointed(message_id=message_id, message=message, last_seq=last_seq)

    def _connection(self) -> Any:
        """The factory's connection for one step; None without a factory (SPEC §9: a step that
        never uses its connection still runs, as under ``drain()`` in tests)."""
        return self._transaction_connection() if self._transaction_connection is not None else None

    def _holds(self, task: ActivityTask) -> bool:
        with self._lock:
            row = self._activity_tasks.get(task.task_id)
            return row is not None and row.lease.is_(task.lease)

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        raise TypeError(_NO_CONNECTION)

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        raise TypeError(_NO_CONNECTION)

    # -- queues ------------------------------------------------------------------------------
    def create_queue(self, name: str, kind: str, capacity: int) -> None:
        check_queue(name, kind, capacity)
        with self._lock:
            self._queue(name, kind).capacity = capacity

    def _existing_queue(self, name: str, kind: str) -> QueueRow:
        check_queue(name, kind, 1)
        queue = self._queues.get((name, kind))
        if queue is None:
            raise ValueError(f"there is no {kind} queue named {name!r}")
        return queue

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        with self._lock:
            self._existing_queue(name, kind).paused = paused

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        check_queue(name, kind, capacity)
        with self._lock:
            self._existing_queue(name, kind).capacity = capacity

    def list_queues(self) -> list[QueueInfo]:
        with self._lock:
            infos = []
            for (name, kind), queue in sorted(self._queues.items()):
                tasks: Iterable[WorkflowTaskRow | ActivityTaskRow] = (
                    self._workflow_tasks.values() if kind == WORKFLOW else self._activity_tasks.values()
                )
                depth = sum(1 for t in tasks if t.queue == name)
                status = "PAUSED" if queue.paused else "ACTIVE"
                infos.append(QueueInfo(name=name, kind=kind, status=status, capacity=queue.capacity, depth=depth))
            return infos

    def activity_slots(self) -> list[ActivitySlots]:
        with self._lock:
            return [
                ActivitySlots(
                    queue=name, paused=queue.paused, capacity=queue.capacity, held=self._queued_activity_tasks(name)
                )
                for (name, kind), queue in sorted(self._queues.items())
                if kind == ACTIVITY
            ]

    # -- leadership and maintenance -------------------------------------------------------------
    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        storable.text(node_id, "node_id")
        with self._lock:
            if self._leader is None or self._leader[0] == node_id or self._leader[1] <= now:
                self._leader = (node_id, now + ttl)
                return True
            return False

    def release_leadership(self, node_id: str) -> None:
        with self._lock:
            if self._leader is not None and self._leader[0] == node_id:
                self._leader = None

    def next_due_time(self, now: datetime) -> datetime | None:
        with self._lock:
            moments = [m.visible_from for inbox in self._inbox.values() for m in inbox]
            moments += [t.visible_from for t in self._activity_tasks.values() if t.state == CREATED]
            moments += [t.lease.until for t in self._activity_tasks.values() if t.lease.until is not None]
            moments += [t.lease.until for t in self._workflow_tasks.values() if t.lease.until is not None]
            future = [m for m in moments if m > now]
            return min(future) if future else None


_DISPATCH_BATCH = 256  # as many as the PostgreSQL adapter schedules inside a completion

_NO_FACTORY = (
    "create the in-memory adapter with InMemoryAdapter(transaction_connection=<a function returning a DB-API"
    " connection>)"
)

_NO_CONNECTION = (
    "connection= needs the PostgreSQL adapter: the in-memory adapter has no database transaction to write through"
)


def _without_connection(failed: StepFailed, conn: Any, name: str) -> StepFailed:
    """A step that used the connection it does not have (no factory): a terminal failure that
    says what to do, not the ``AttributeError`` of ``None``; any other failure as it is."""
    if conn is None and isinstance(failed.cause, AttributeError) and "'NoneType'" in str(failed.cause):
        return StepFailed(
            TerminalError(
                f"transaction step {name!r} used its connection, but there is none ({failed.cause}): {_NO_FACTORY}"
            )
        )
    return failed


def _end(conn: Any, how: str) -> None:
    """Commit or roll back the factory's connection (one without the method is left as it is)."""
    end = getattr(conn, how, None)
    if callable(end):
        end()
