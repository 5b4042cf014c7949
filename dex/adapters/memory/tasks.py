"""The in-memory adapter's task queues: workflow and activity tasks, claimed under leases.

Scheduling tasks from runs' inboxes (workflow tasks) and from completed workflow tasks
(activity tasks), claiming them under a lease, and applying what a finished task wrote:
a workflow task's new history, children, activity tasks, outcome and messages; an activity
task's result or retry. A result whose lease was lost is refused. Part of
:class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

import attrs

from dex.adapters.memory import endings, storable, streams
from dex.adapters.memory.instance_keys import start_child
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tables import CREATED, QUEUED, ActivityTaskRow
from dex.app.ports.attempts import FAILED, LOST, lost_attempt
from dex.app.ports.store import (
    ACTIVITY,
    WORKFLOW,
    ActivityOutcome,
    ActivityTask,
    AnsweredStep,
    FailedAttempt,
    PendingAttempt,
    StepAttempts,
    WorkflowTask,
)
from dex.domain import events as ev
from dex.domain.endings import kept_activity_tasks, kept_messages
from dex.domain.errors import RunNotFoundError
from dex.domain.queue_limits import key_grants
from dex.domain.queue_limits import key_holders as key_holders_of
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo
from dex.domain.writes import (
    INBOX_ORDER,
    dropped_update_answers,
    instance_clash,
    plan_write,
    survives_continue_as_new,
    wakes_suspended,
)

_INBOX_ORDER = operator.attrgetter(*INBOX_ORDER)  # the domain's order of a run's visible messages


class MemoryTasks:
    """The workflow-task and activity-task operations of the in-memory adapter."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    # -- workflow tasks -----------------------------------------------------------------------
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        with self._state.lock:
            # per key, its live holders per queue (queue_limits.key_holders)
            key_holders: dict[str, Counter[str]] = {}
            for held in self._state.runs.values():
                if held.holds_key and not held.status.is_terminal and held.created.concurrency_key is not None:
                    key_holders.setdefault(held.created.concurrency_key, Counter())[held.created.queue] += 1
            concurrency = {
                name: queue.key_concurrency for (name, kind), queue in self._state.queues.items() if kind == WORKFLOW
            }
            candidates = []
            for run_id, inbox in self._state.inbox.items():
                row = self._state.runs[run_id]
                if row.status.is_terminal or run_id in self._state.workflow_task_of_run:
                    continue
                visible = [m for m in inbox if m.visible_from <= now]
                if not visible:
                    continue
                cancel = any(wakes_suspended(m.event) for m in visible)
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
                queue = self._state.queue(row.created.queue, WORKFLOW)
                if needs_key:
                    assert key is not None
                    holders = key_holders.get(key, Counter())
                    if key_grants(queue.key_concurrency, *key_holders_of(holders, concurrency, queue.name)) == 0:
                        continue
                if queue.paused or self._state.active_workflow_tasks(queue.name) >= queue.capacity:
                    continue
                if needs_key:
                    assert key is not None
                    row.holds_key = True
                    key_holders.setdefault(key, Counter())[queue.name] += 1
                self._state.add_workflow_task(row, queue.name)
                created += 1
            return created

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        storable.texts(names, "workflow name")
        storable.text(owner, "owner")
        with self._state.lock:
            ready = [
                t
                for t in self._state.workflow_tasks.values()
                if t.workflow_name in names
                and not t.lease.held(now)
                and not self._state.queue(t.queue, WORKFLOW).paused
            ]
            ready.sort(key=lambda t: (-t.priority, t.task_id))
            claimed: list[WorkflowTask] = []
            for task in ready:
                if len(claimed) >= limit:
                    break
                if not self._state.queue(task.queue, WORKFLOW).take_start(now):
                    continue  # its queue's rate limit has no slot free now
                task.lease.take(owner, now + lease)
                claimed.append(task.claimed())
            return claimed

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        with self._state.lock:
            row = self._state.runs.get(task.run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {task.run_id!r}")
            visible = sorted(
                (m for m in self._state.inbox.get(task.run_id, []) if m.visible_from <= now), key=_INBOX_ORDER
            )
            inbox = [InboxMessage(message_id=m.message_id, event=m.event) for m in visible]
            return [e for e in row.history if e.sequence_number >= after_seq], inbox

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        storable.workflow_results(results)  # before anything changes: the batch is all or nothing
        with self._state.lock:
            return [self.complete_workflow_task(task, result, now) for task, result in results]

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        if failure is not None:
            storable.protobuf(failure, "task failure")
        with self._state.lock:
            given_back = []
            for task, retry_at in retries:
                row = self._state.workflow_tasks.get(task.task_id)
                held = row is not None and row.lease.is_(task.lease)
                if held and row is not None:
                    # claimable again once retry_at has passed; a late result of this claim
                    # no longer matches the version
                    row.lease.until = retry_at
                    row.lease.version += 1
                    run = self._state.runs.get(task.run_id)
                    if failure is not None and run is not None:
                        run.task_failure = failure
                given_back.append(held)
            return given_back

    def holds_workflow_task(self, task: WorkflowTask, expected_last_seq: int) -> bool:
        """Whether ``task`` is still held by its lease and its run's history ends where expected
        (the caller holds the state's lock)."""
        row_task = self._state.workflow_tasks.get(task.task_id)
        run = self._state.runs.get(task.run_id)
        return (
            row_task is not None
            and row_task.lease.is_(task.lease)
            and run is not None
            and run.history[-1].sequence_number == expected_last_seq
        )

    def complete_workflow_task(
        self, task: WorkflowTask, result: WorkflowTaskResult, now: datetime, keep: bool = False
    ) -> bool:
        """Apply ``result``; with ``keep``, the task stays claimed (a checkpoint of a task that goes
        on). The caller holds the state's lock (forks and steps apply results inside their own)."""
        if isinstance(task, AnsweredStep):
            if keep or not self._answerable(task, result, now):  # (never kept: it holds no task)
                return False  # nothing written: the engine writes the outcome the ordinary way
            del self._state.activity_tasks[task.outcome.task.task_id]
            return self.apply_result(task.run_id, result, now)
        row_task = self._state.workflow_tasks.get(task.task_id)
        if row_task is None or not row_task.lease.is_(task.lease):
            return False  # the lease was lost: another worker owns (or finished) this task
        if not keep:
            del self._state.workflow_tasks[task.task_id]
            del self._state.workflow_task_of_run[task.run_id]
        run = self._state.runs.get(task.run_id)
        if run is None:
            return False
        if run.history[-1].sequence_number != result.expected_last_seq:
            return False  # a racing duplicate already wrote this part of the history
        return self.apply_result(task.run_id, result, now)

    def _answerable(self, task: AnsweredStep, result: WorkflowTaskResult, now: datetime) -> bool:
        """Whether an answered step's result may apply (see :class:`AnsweredStep`)."""
        outcome = task.outcome
        activity = self._state.activity_tasks.get(outcome.task.task_id)
        run = self._state.runs.get(task.run_id)
        if activity is None or not activity.lease.is_(outcome.task.lease) or outcome.retry_at is not None:
            return False  # the claim was lost, or the outcome is a retry (no message for the run)
        if run is None or run.status is not RunStatus.RUNNING or task.run_id in self._state.workflow_task_of_run:
            return False
        if run.history[-1].sequence_number != result.expected_last_seq:
            return False
        if any(m.visible_from <= now for m in self._state.inbox.get(task.run_id, [])):
            return False  # what the run was sent comes first: its workflow task takes it all in order
        return not self._state.queue(run.created.queue, WORKFLOW).held_back

    def apply_result(self, run_id: str, result: WorkflowTaskResult, now: datetime) -> bool:
        """Write ``result`` to the run (checked by the caller, who holds the state's lock)."""
        run = self._state.runs[run_id]
        plan = plan_write(result, run.status)
        consumed = set(plan.consumed)
        inbox = [m for m in self._state.inbox[run.run_id] if m.message_id not in consumed]
        if plan.replaces_history:
            inbox = [m for m in inbox if survives_continue_as_new(m.event)]
            run.history = list(plan.events)
        else:
            run.history.extend(plan.events)
        self._state.inbox[run.run_id] = inbox
        if plan.started:
            run.started_at = now
        if plan.sets_custom_status:
            run.custom_status = plan.custom_status
        run.task_failure = None  # a result applied: the run is not held (any more)
        for child in plan.child_runs:  # the parent is still live here: a child may clash with it
            if not child.rule.plain:  # id_reuse: an ended run of its id may answer (instance_keys.py)
                start_child(self._state, run.run_id, child, now)
            elif self._state.find_live_instance(child.created.instance_id) is not None:
                self._state.push(run.run_id, instance_clash(child), now)
            else:
                self._state.insert_run(child.run_id, child.created, now)
        run.status = plan.status
        if plan.labels is not None:
            run.labels = plan.labels
        endings.drop_cancelled_steps(self._state, run.run_id, plan)
        endings.create_detached(self._state, plan, now)
        streams.apply_plan(self._state, run.run_id, plan)  # with its history block, under the same lock
        for spec in kept_activity_tasks(plan):
            self._state.ensure_queue(spec.queue, ACTIVITY)
            task_id = next(self._state.ids)
            self._state.activity_tasks[task_id] = ActivityTaskRow(
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
            if spec.failure is not None and spec.attempt > 1:  # its first attempt ran inline and failed
                failed = FailedAttempt(attempt=spec.attempt - 1, at=now, kind=FAILED, failure=spec.failure)
                self._state.record_attempt(spec.run_id, spec.created_seq, failed, spec.attempt)
        self._state.keep_answers(run.run_id, plan.update_answers)
        if plan.completion is not None:
            completion = plan.completion
            run.completed_at, run.result, run.failure, run.holds_key = now, completion.result, completion.failure, False
            run.unread_events = plan.unread_events
            dropped = dropped_update_answers(m.event for m in self._state.inbox[run.run_id])
            self._state.keep_answers(run.run_id, dropped)
            self._state.inbox[run.run_id] = []
            for task_id in [t for t, a in self._state.activity_tasks.items() if a.run_id == run.run_id]:
                del self._state.activity_tasks[task_id]
        for message in kept_messages(run.run_id, plan):
            self._state.deliver(message.run_id, message.event, message.visible_from)
        return True

    # -- activity tasks -------------------------------------------------------------------------
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        with self._state.lock:
            waiting = [t for t in self._state.activity_tasks.values() if t.state == CREATED and t.visible_from <= now]
            waiting.sort(key=lambda t: (-t.priority, t.task_id))
            moved = 0
            for task in waiting:
                if moved >= limit:
                    break
                queue = self._state.queue(task.queue, ACTIVITY)
                if queue.paused or self._state.queued_activity_tasks(queue.name) >= queue.capacity:
                    continue
                task.state = QUEUED
                moved += 1
            return moved

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        storable.texts(names, "activity name")
        storable.text(owner, "owner")
        with self._state.lock:
            ready = [
                t
                for t in self._state.activity_tasks.values()
                if t.state == QUEUED
                and t.name in names
                and not t.lease.held(now)
                and not self._state.queue(t.queue, ACTIVITY).paused
            ]
            ready.sort(key=lambda t: (-t.priority, t.task_id))
            claimed: list[ActivityTask] = []
            for task in ready:
                if len(claimed) >= limit:
                    break
                if not self._state.queue(task.queue, ACTIVITY).take_start(now):
                    continue  # its queue's rate limit has no slot free now
                if task.lease.owner is not None and task.lease.until is not None:
                    # the previous holder's lease expired: that attempt is lost, and kept as such
                    lost = FailedAttempt(
                        attempt=task.attempt,
                        at=task.lease.until,
                        kind=LOST,
                        failure=lost_attempt(task.attempt, task.lease.until),
                    )
                    task.attempt += 1
                    self._state.record_attempt(task.run_id, task.created_seq, lost, task.attempt)
                task.lease.take(owner, now + min(lease, task.lock_timeout))
                claimed.append(task.claimed())
            return claimed

    def step_attempts(self, run_id: str, created_seqs: Collection[int] | None = None) -> list[StepAttempts]:
        with self._state.lock:
            steps = dict(self._state.attempts.get(run_id, {}))
            for row in self._state.activity_tasks.values():
                if row.run_id != run_id:
                    continue
                known = steps.get(row.created_seq, StepAttempts(created_seq=row.created_seq))
                steps[row.created_seq] = attrs.evolve(known, pending=_pending(row))
            wanted = steps.keys() if created_seqs is None else frozenset(created_seqs)
            return [steps[seq] for seq in sorted(steps) if seq in wanted]

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        with self._state.lock:
            rows = [self._state.activity_tasks.get(task_id) for task_id in task_ids]
            return [
                row.claimed() if row is not None and row.state == QUEUED and row.lease.owner is not None else None
                for row in rows
            ]

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        storable.heartbeats(tasks)
        with self._state.lock:
            extended = []
            for task in tasks:
                row = self._state.activity_tasks.get(task.task_id)
                held = row is not None and row.lease.is_(task.lease)
                if held and row is not None:
                    row.lease.until = now + min(lease, row.lock_timeout)
                extended.append(held)
            return extended

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        storable.activity_outcomes(outcomes)  # before anything changes: the batch is all or nothing
        with self._state.lock:
            return [self._complete_activity_task(outcome, now) for outcome in outcomes]

    def _complete_activity_task(self, outcome: ActivityOutcome, now: datetime) -> bool:
        row = self._state.activity_tasks.get(outcome.task.task_id)
        if row is None or not row.lease.is_(outcome.task.lease):
            return False
        if outcome.retry_at is not None:
            if outcome.counts and outcome.failure is not None:  # kept with the retry's own write
                failed = FailedAttempt(attempt=row.attempt, at=now, kind=FAILED, failure=outcome.failure)
                self._state.record_attempt(row.run_id, row.created_seq, failed, row.attempt + 1)
            row.state, row.visible_from = CREATED, outcome.retry_at
            row.attempt += 1 if outcome.counts else 0  # a retry the machinery caused is the same attempt
            row.lease.clear()
            return True
        del self._state.activity_tasks[row.task_id]
        message = outcome.message
        assert message is not None
        self._state.deliver(row.run_id, message, now)
        return True


def _pending(row: ActivityTaskRow) -> PendingAttempt:
    """An activity task as :class:`PendingAttempt` says it (ports/attempts.py)."""
    if row.state == CREATED:
        return PendingAttempt(attempt=row.attempt, state="waiting", visible_from=row.visible_from)
    until = row.lease.until if row.lease.owner is not None else None
    return PendingAttempt(
        attempt=row.attempt,
        state="running" if until is not None else "queued",
        visible_from=row.visible_from,
        lease_until=until,
    )
