"""The store as the simulated engines see it: the in-memory adapter, watched by a referee.

:class:`ObservedAdapter` is the in-memory adapter with every call that grants, extends or
gives back a lease, writes a workflow result or changes the leadership reported to a
:class:`dex.simulation.referee.Referee`. It can be told to fail the next completion call
(:class:`StoreUnavailable`), before it writes or after, and it names new runs from a seeded
generator instead of ``uuid4``, so that a seed replays exactly, run ids included.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivityOutcome, ActivityTask, Clock, WorkflowTask
from dex.app.ports.transactions import Checkpointed, CheckpointOutcome, StepCheckpoint
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import WorkflowTaskResult
from dex.domain.values import FailureInfo
from dex.simulation.invariants import InvariantViolation
from dex.simulation.referee import Referee


class StoreUnavailable(Exception):
    """A write the simulated database refused, or whose acknowledgement it lost."""


class ObservedAdapter(InMemoryAdapter):
    """The in-memory adapter, reporting to a referee (see the module docstring).

    ``sabotage`` makes the next completion call fail: "refuse" before it writes anything,
    "lose-ack" after it wrote everything (as a connection that drops before the commit's
    acknowledgement arrives).
    """

    def __init__(
        self,
        clock: Clock,
        referee: Referee,
        ids: random.Random,
        transaction_connection: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(clock=clock, transaction_connection=transaction_connection)
        self.referee = referee
        self._run_ids = ids
        self._again = False
        self.sabotage: str | None = None

    def _sabotaged(self, moment: str) -> None:
        if self.sabotage == moment:
            self.sabotage = None
            raise StoreUnavailable(f"simulated database failure ({moment})")

    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        run_id = str(uuid.UUID(int=self._run_ids.getrandbits(128), version=4))
        got = super().create_run(run_id, created, now)
        if got == run_id:
            with self.referee.judging():
                self.referee.run_created(run_id, self.load_history(run_id))
        return got

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        super().send_message(run_id, message, now)
        if isinstance(message, ev.ExternalEventReceived):
            self.referee.runs[run_id].sent[(message.event_id, message.payload.data)] += 1

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        super().request_transition(run_id, target, message, now)
        self.referee.runs[run_id].requests.append((target, now))

    def claim_workflow_tasks(
        self, names: Any, owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        tasks = super().claim_workflow_tasks(names, owner, now, lease, limit)
        with self.referee.judging():
            for task in tasks:
                self.referee.leases.claimed("workflow", task.task_id, task.run_id, task.lease, now)
        return tasks

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        given_back = super().retry_workflow_tasks(retries, now, failure)
        with self.referee.judging():
            for (task, _at), ok in zip(retries, given_back, strict=True):
                self.referee.leases.given_back("workflow", task.task_id, task.lease, ok)
                self.referee.counts["given back"] += ok
        return given_back

    def claim_activity_tasks(
        self, names: Any, owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        tasks = super().claim_activity_tasks(names, owner, now, lease, limit)
        with self.referee.judging():
            for task in tasks:
                self.referee.leases.claimed("activity", task.task_id, task.run_id, task.lease, now)
        return tasks

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        extended = super().extend_activity_leases(tasks, now, lease)
        with self.referee.judging():
            for task, ok in zip(tasks, extended, strict=True):
                if ok:
                    self.referee.leases.extended(
                        "activity", task.task_id, task.lease, now + min(lease, task.lock_timeout)
                    )
        return extended

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        self._sabotaged("refuse")
        applied = super().complete_workflow_tasks(results, now)
        with self.referee.judging():
            self._judge_workflow_results(results, applied)
        self._sabotaged("lose-ack")
        return applied

    def _judge_workflow_results(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], applied: list[bool]
    ) -> None:
        touched: set[str] = set()
        for (task, result), ok in zip(results, applied, strict=True):
            self.referee.workflow_result(task, result, ok, self._again)
            if ok:
                touched.add(result.run_id)
                for child in result.child_runs:
                    if self.get_run(child.run_id) is not None and child.run_id not in self.referee.runs:
                        self.referee.run_created(child.run_id, self.load_history(child.run_id))
        for run_id in sorted(touched):
            if self.load_history(run_id) != self.referee.runs[run_id].history:
                raise InvariantViolation(
                    "history-as-decided", f"run {run_id}: the store wrote another history than decided"
                )

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        outcomes = super().checkpoint_steps(items, now)
        with self.referee.judging():
            for item, outcome in zip(items, outcomes, strict=True):
                if isinstance(outcome, Checkpointed):  # the task's result so far, the task kept
                    self.referee.checkpoint(item.task, item.result, kept=True)
                    if self.load_history(item.task.run_id) != self.referee.runs[item.task.run_id].history:
                        raise InvariantViolation(
                            "history-as-decided", f"run {item.task.run_id}: a checkpoint wrote another history"
                        )
        return outcomes

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        self._sabotaged("refuse")
        applied = super().complete_activity_tasks(outcomes, now)
        with self.referee.judging():
            for outcome, ok in zip(outcomes, applied, strict=True):
                self.referee.activity_outcome(outcome, ok, self._again)
        self._sabotaged("lose-ack")
        return applied

    def deliver_again(self, pick: int, now: datetime) -> str | None:
        """Deliver a recent completion once more (a duplicate); say which, or None if none."""
        if not self.referee.deliveries:
            return None
        kind, item = self.referee.deliveries[pick % len(self.referee.deliveries)]
        self._again = True
        try:
            if kind == "workflow":
                self.complete_workflow_tasks([item], now)
                return f"workflow result of task {item[0].task_id}"
            self.complete_activity_tasks([item], now)
            return f"activity outcome of task {item.task.task_id}"
        finally:
            self._again = False

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        # the callers waiting for update answers are woken as each is written: they have theirs
        # before retention deletes the run with its answers
        self.referee.collect_answers(self)
        return super().delete_finished_runs(completed_before, limit)

    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        leading = super().try_lead(node_id, now, ttl)
        if leading:
            with self.referee.judging():
                self.referee.leader.granted(node_id, now, ttl)
        return leading

    def release_leadership(self, node_id: str) -> None:
        super().release_leadership(node_id)
        self.referee.leader.released(node_id)
