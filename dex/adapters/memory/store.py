"""InMemoryAdapter: every port of :mod:`dex.app.ports` over Python dicts.

One re-entrant lock serialises all operations, which makes each one atomic just as a
transaction is in PostgreSQL. Iteration orders are fixed (priority, then id), so the same
calls in the same order give the same results: the simulator and hypothesis rely on that.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta

from dex.adapters.memory import storable
from dex.adapters.memory.tables import (
    CREATED,
    QUEUED,
    ActivityTaskRow,
    InboxRow,
    QueueRow,
    RunRow,
    WorkflowTaskRow,
)
from dex.app.clock import SystemClock
from dex.app.ports import (
    Loaded,
    ACTIVITY,
    QUEUE_KINDS,
    WORKFLOW,
    ActivityOutcome,
    ActivityTask,
    Claim,
    Clock,
    Loaded,
    QueueInfo,
    RunFilter,
    RunRecord,
    WorkflowTask,
)
from dex.domain import events as ev
from dex.domain.definitions import validate_queue
from dex.domain.errors import DexError, InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus, transition
from dex.domain.task import InboxMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo


class InMemoryAdapter:
    """A complete, deterministic store in process memory. Several engines may share one."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._runs: dict[str, RunRow] = {}
        self._inbox: dict[str, list[InboxRow]] = {}
        self._workflow_tasks: dict[int, WorkflowTaskRow] = {}
        self._workflow_task_of_run: dict[str, int] = {}
        self._activity_tasks: dict[int, ActivityTaskRow] = {}
        self._queues: dict[tuple[str, str], QueueRow] = {}
        self._leader: tuple[str, datetime] | None = None

    @property
    def clock(self) -> Clock:
        return self._clock

    def close(self) -> None:
        pass

    # -- runs ------------------------------------------------------------------------------
    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        storable.created(run_id, created)
        with self._lock:
            existing = self._find_live_instance(created.instance_id)
            if existing is not None:
                return existing
            self._insert_run(run_id, created, now)
            return run_id

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
            return got, [task.claimed()], [(list(self._runs[run_id].history), inbox)]

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

    def _push(self, run_id: str, message: ev.Message, visible_from: datetime) -> None:
        self._inbox[run_id].append(
            InboxRow(message_id=next(self._ids), run_id=run_id, event=message, visible_from=visible_from)
        )

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

    def get_run(self, run_id: str) -> RunRecord | None:
        storable.text(run_id, "run_id")
        with self._lock:
            row = self._runs.get(run_id)
            return row.record() if row is not None else None

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        storable.texts(run_ids, "run_id")
        with self._lock:
            rows = (self._runs.get(run_id) for run_id in dict.fromkeys(run_ids))
            return [row.record() for row in rows if row is not None]

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        storable.text(run_filter.workflow_name, "workflow_name")
        storable.text(run_filter.instance_id, "instance_id")
        storable.labels(run_filter.labels)
        with self._lock:
            rows = [row for row in self._runs.values() if _matches(row, run_filter)]
            rows.sort(key=lambda r: (r.created_at, r.position), reverse=True)
            return [row.record() for row in rows[: run_filter.limit]]

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        storable.text(run_id, "run_id")
        with self._lock:
            row = self._runs.get(run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            return list(row.history)

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        storable.text(run_id, "run_id")
        storable.protobuf(message, "message")
        with self._lock:
            self._live_run(run_id)
            self._push(run_id, message, now)

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        storable.messages(items)  # before anything changes: the batch is all or nothing
        with self._lock:
            errors: list[DexError | None] = []
            for run_id, message in items:
                try:
                    self.send_message(run_id, message, now)
                except (RunNotFoundError, InvalidStateError) as exc:
                    errors.append(exc)
                else:
                    errors.append(None)
            return errors

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        storable.text(run_id, "run_id")
        storable.protobuf(message, "message")
        with self._lock:
            row = self._live_run(run_id)
            transition(row.status, target)
            if target is not RunStatus.CANCELLED:
                row.status = target
            elif any(isinstance(m.event, ev.RunCancelled) for m in self._inbox[run_id]):
                return  # a cancel is already on its way
            self._push(run_id, message, now)

    # -- workflow tasks -----------------------------------------------------------------------
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        with self._lock:
            key_holders = {
                row.created.concurrency_key
                for row in self._runs.values()
                if row.holds_key and not row.status.is_terminal
            }
            candidates = []
            for run_id, inbox in self._inbox.items():
                row = self._runs[run_id]
                if row.status.is_terminal or run_id in self._workflow_task_of_run:
                    continue
                visible = [m for m in inbox if m.visible_from <= now]
                if not visible:
                    continue
                cancel = any(isinstance(m.event, ev.RunCancelled) for m in visible)
                if row.status is RunStatus.SUSPENDED and not cancel:
                    continue
                candidates.append((row, cancel))
            candidates.sort(key=lambda c: (-c[0].created.priority, c[0].created_at, c[0].position))
            created = 0
            for row, cancel in candidates:
                if created >= limit:
                    break
                key = row.created.concurrency_key
                needs_key = key is not None and not row.holds_key and not cancel
                if needs_key and key in key_holders:
                    continue
                queue = self._queue(row.created.queue, WORKFLOW)
                if queue.paused or self._active_workflow_tasks(queue.name) >= queue.capacity:
                    continue
                if needs_key:
                    row.holds_key = True
                    key_holders.add(key)
                self._add_workflow_task(row, queue.name)
                created += 1
            return created

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

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        storable.texts(names, "workflow name")
        storable.text(owner, "owner")
        with self._lock:
            ready = [
                t
                for t in self._workflow_tasks.values()
                if t.workflow_name in names and not t.lease.held(now) and not self._queue(t.queue, WORKFLOW).paused
            ]
            ready.sort(key=lambda t: (-t.priority, t.task_id))
            claimed = []
            for task in ready[:limit]:
                task.lease.take(owner, now + lease)
                claimed.append(task.claimed())
            return claimed

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        with self._lock:
            row = self._runs.get(task.run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {task.run_id!r}")
            # in the order the messages became visible: a timer inserted early but due late
            # must not overtake an event that arrived before it fired
            visible = sorted(
                (m for m in self._inbox.get(task.run_id, []) if m.visible_from <= now),
                key=lambda m: (m.visible_from, m.message_id),
            )
            inbox = [InboxMessage(message_id=m.message_id, event=m.event) for m in visible]
            return [e for e in row.history if e.sequence_number >= after_seq], inbox

    def load_workflow_tasks(
        self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime
    ) -> list[tuple[list[ev.HistoryEvent], list[InboxMessage]] | Exception]:
        with self._lock:
            loaded: list[tuple[list[ev.HistoryEvent], list[InboxMessage]] | Exception] = []
            for task, after_seq in requests:
                try:
                    loaded.append(self.load_workflow_task(task, now, after_seq))
                except RunNotFoundError as exc:
                    loaded.append(exc)
            return loaded

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        storable.workflow_results(results)  # before anything changes: the batch is all or nothing
        with self._lock:
            return [self._complete_workflow_task(task, result, now) for task, result in results]

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        with self._lock:
            applied = self.complete_workflow_tasks(results, now)
            if not any(result.activity_tasks for (_task, result), ok in zip(results, applied, strict=True) if ok):
                return applied, []
            self.schedule_activity_tasks(now, _DISPATCH_BATCH)
            return applied, self.claim_activity_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)

    def retry_workflow_tasks(self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime) -> list[bool]:
        with self._lock:
            given_back = []
            for task, retry_at in retries:
                row = self._workflow_tasks.get(task.task_id)
                held = row is not None and row.lease.is_(task.lease)
                if held and row is not None:
                    # claimable again once retry_at has passed; a late result of this claim
                    # no longer matches the version
                    row.lease.until = retry_at
                    row.lease.version += 1
                given_back.append(held)
            return given_back

    def _complete_workflow_task(self, task: WorkflowTask, result: WorkflowTaskResult, now: datetime) -> bool:
        row_task = self._workflow_tasks.get(task.task_id)
        if row_task is None or not row_task.lease.is_(task.lease):
            return False  # the lease was lost: another worker owns (or finished) this task
        del self._workflow_tasks[task.task_id]
        del self._workflow_task_of_run[task.run_id]
        run = self._runs.get(task.run_id)
        if run is None:
            return False
        if run.history[-1].sequence_number != result.expected_last_seq:
            return False  # a racing duplicate already wrote this part of the history
        consumed = set(result.consumed)
        inbox = [m for m in self._inbox[run.run_id] if m.message_id not in consumed]
        if result.new_history is not None:
            inbox = [m for m in inbox if isinstance(m.event, _SURVIVE_CONTINUE_AS_NEW)]
            run.history = list(result.new_history)
        else:
            run.history.extend(result.new_events)
        self._inbox[run.run_id] = inbox
        if result.started and run.status is RunStatus.CREATED:
            run.status, run.started_at = RunStatus.RUNNING, now
        if result.new_events:
            run.custom_status = result.custom_status
        for child in result.child_runs:
            if self._find_live_instance(child.created.instance_id) is not None:
                failure = FailureInfo(
                    type="InvalidStateError",
                    message=f"instance id {child.created.instance_id!r} is in use by a running run",
                    terminal=True,
                )
                self._push(run.run_id, ev.ChildRunFailed(child_run_id=child.run_id, failure=failure), now)
            else:
                self._insert_run(child.run_id, child.created, now)
        for spec in result.activity_tasks:
            self.ensure_queue(spec.queue, ACTIVITY)
            task_id = next(self._ids)
            self._activity_tasks[task_id] = ActivityTaskRow(
                task_id=task_id,
                run_id=spec.run_id,
                created_seq=spec.created_seq,
                name=spec.name,
                input=spec.input,
                queue=spec.queue,
                priority=spec.priority,
                retry_policy=spec.retry_policy,
                lock_timeout=spec.lock_timeout,
                visible_from=spec.visible_from,
                trace_context=spec.trace_context,
                attempt=spec.attempt,
            )
        if result.completion is not None:
            self._finish_run(run, result, now)
        for message in result.messages:
            self._deliver(message.run_id, message.event, message.visible_from)
        return True

    def _finish_run(self, run: RunRow, result: WorkflowTaskResult, now: datetime) -> None:
        completion = result.completion
        assert completion is not None
        # no transition check: a suspend that raced with the run's last task loses to its outcome
        run.status = completion.status
        run.completed_at, run.result, run.failure, run.holds_key = now, completion.result, completion.failure, False
        self._inbox[run.run_id] = []
        for task_id in [t for t, a in self._activity_tasks.items() if a.run_id == run.run_id]:
            del self._activity_tasks[task_id]

    # -- activity tasks -------------------------------------------------------------------------
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        with self._lock:
            waiting = [t for t in self._activity_tasks.values() if t.state == CREATED and t.visible_from <= now]
            waiting.sort(key=lambda t: (-t.priority, t.task_id))
            moved = 0
            for task in waiting:
                if moved >= limit:
                    break
                queue = self._queue(task.queue, ACTIVITY)
                if queue.paused or self._queued_activity_tasks(queue.name) >= queue.capacity:
                    continue
                task.state = QUEUED
                moved += 1
            return moved

    def _queued_activity_tasks(self, queue: str) -> int:
        return sum(1 for t in self._activity_tasks.values() if t.queue == queue and t.state == QUEUED)

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        storable.texts(names, "activity name")
        storable.text(owner, "owner")
        with self._lock:
            ready = [
                t
                for t in self._activity_tasks.values()
                if t.state == QUEUED
                and t.name in names
                and not t.lease.held(now)
                and not self._queue(t.queue, ACTIVITY).paused
            ]
            ready.sort(key=lambda t: (-t.priority, t.task_id))
            claimed = []
            for task in ready[:limit]:
                if task.lease.owner is not None:
                    task.attempt += 1  # the previous holder's lease expired: that attempt is lost
                task.lease.take(owner, now + min(lease, task.lock_timeout))
                claimed.append(task.claimed())
            return claimed

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        storable.heartbeats(tasks)
        with self._lock:
            extended = []
            for task in tasks:
                row = self._activity_tasks.get(task.task_id)
                held = row is not None and row.lease.is_(task.lease)
                if held and row is not None:
                    row.lease.until = now + min(lease, row.lock_timeout)
                extended.append(held)
            return extended

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        storable.activity_outcomes(outcomes)  # before anything changes: the batch is all or nothing
        with self._lock:
            return [self._complete_activity_task(outcome, now) for outcome in outcomes]

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

    def _complete_activity_task(self, outcome: ActivityOutcome, now: datetime) -> bool:
        row = self._activity_tasks.get(outcome.task.task_id)
        if row is None or not row.lease.is_(outcome.task.lease):
            return False
        if outcome.retry_at is not None:
            row.state, row.visible_from, row.attempt = CREATED, outcome.retry_at, row.attempt + 1
            row.lease.clear()
            return True
        del self._activity_tasks[row.task_id]
        message = outcome.message
        assert message is not None
        self._deliver(row.run_id, message, now)
        return True

    # -- queues ------------------------------------------------------------------------------
    def _queue(self, name: str, kind: str) -> QueueRow:
        queue = self._queues.get((name, kind))
        if queue is None:
            queue = self._queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=100)
        return queue

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        _check_queue(name, kind, capacity)
        with self._lock:
            if (name, kind) not in self._queues:
                self._queues[(name, kind)] = QueueRow(name=name, kind=kind, capacity=capacity)

    def create_queue(self, name: str, kind: str, capacity: int) -> None:
        _check_queue(name, kind, capacity)
        with self._lock:
            self._queue(name, kind).capacity = capacity

    def _existing_queue(self, name: str, kind: str) -> QueueRow:
        _check_queue(name, kind, 1)
        queue = self._queues.get((name, kind))
        if queue is None:
            raise ValueError(f"there is no {kind} queue named {name!r}")
        return queue

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        with self._lock:
            self._existing_queue(name, kind).paused = paused

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        _check_queue(name, kind, capacity)
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

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        with self._lock:
            # the runs that ended first go first, as in PostgreSQL (ORDER BY completed_at)
            ended = [
                row
                for row in self._runs.values()
                if row.status.is_terminal and row.completed_at is not None and row.completed_at < completed_before
            ]
            ended.sort(key=lambda row: (row.completed_at, row.position))
            doomed = [row.run_id for row in ended[:limit]]
            for run_id in doomed:
                del self._runs[run_id]
                self._inbox.pop(run_id, None)
                task_id = self._workflow_task_of_run.pop(run_id, None)  # a stale claim's task goes too
                if task_id is not None:
                    del self._workflow_tasks[task_id]
            return len(doomed)

    def next_due_time(self, now: datetime) -> datetime | None:
        with self._lock:
            moments = [m.visible_from for inbox in self._inbox.values() for m in inbox]
            moments += [t.visible_from for t in self._activity_tasks.values() if t.state == CREATED]
            moments += [t.lease.until for t in self._activity_tasks.values() if t.lease.until is not None]
            moments += [t.lease.until for t in self._workflow_tasks.values() if t.lease.until is not None]
            future = [m for m in moments if m > now]
            return min(future) if future else None


# what a run's inbox keeps when it continues as new: events and requests addressed to the run
# (timers and activity results belong to the old generation)
_SURVIVE_CONTINUE_AS_NEW = (ev.ExternalEventReceived, ev.RunCancelled, ev.RunSuspended, ev.RunResumed)


_DISPATCH_BATCH = 256  # as many as the PostgreSQL adapter schedules inside a completion


def _check_queue(name: str, kind: str, capacity: int) -> None:
    validate_queue(name)
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"queue capacity must be a positive int, got {capacity!r}")


def _matches(row: RunRow, run_filter: RunFilter) -> bool:
    c = row.created
    if run_filter.workflow_name is not None and c.workflow_name != run_filter.workflow_name:
        return False
    if run_filter.statuses is not None and row.status not in run_filter.statuses:
        return False
    if run_filter.instance_id is not None and c.instance_id != run_filter.instance_id:
        return False
    if run_filter.created_after is not None and row.created_at <= run_filter.created_after:
        return False
    if run_filter.created_before is not None and row.created_at >= run_filter.created_before:
        return False
    labels = dict(c.labels)
    return all(labels.get(k) == v for k, v in run_filter.labels)
