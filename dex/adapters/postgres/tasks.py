"""The PostgreSQL adapter's task queues: workflow and activity tasks scheduled, claimed, completed.

Two parts of :class:`~dex.adapters.postgres.PostgresAdapter`, one per kind of task. They run
the SQL of :mod:`.workflow_tasks`, :mod:`.activity_tasks`, :mod:`.activity_outcomes` and, for
the completions that hand the next step over at once ("complete, then claim"), :mod:`.dispatch`.

Claims and loads are one autocommit statement each; a completion is one pipelined transaction
(a batch of finished activity attempts: one call of the schema's function). The queues a
workflow task's results start using get their rows and partitions first, in transactions of
their own (DDL), so that the completion's transaction only inserts rows. A batch the database
refuses (bad data in one result) is raised as ``StoreRejectedError``, one it fails otherwise for
its statements as ``StoreWriteError`` (:mod:`.refusals`); the engine's buffer splits either to
find the culprit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from dex.adapters.postgres import activity_outcomes, activity_tasks, attempts, dispatch, rate_limits, workflow_tasks
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.rate_limits import LimitedQueues, Reservations
from dex.adapters.postgres.refusals import batch_refusals
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import (
    ACTIVITY,
    WORKFLOW,
    ActivityOutcome,
    ActivityTask,
    Claim,
    Loaded,
    StepAttempts,
    WorkflowTask,
)
from dex.domain import events as ev
from dex.domain.task import InboxMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo


class PostgresWorkflowTasks:
    """The workflow-task ports: schedule, claim, load, complete (then claim), retry."""

    def __init__(
        self, db: Database, q: Statements, queues: PostgresQueues, limited: LimitedQueues, reservations: Reservations
    ) -> None:
        self._db = db
        self._q = q
        self._queues = queues
        self._limited = limited
        self._reservations = reservations

    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        with self._db.transaction() as conn:
            return workflow_tasks.schedule_workflow_tasks(conn, self._q, now, limit)

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        # asked before the claim's connection is taken: a read of the queues, once a second,
        # takes a connection of its own
        limited = self._limited.of_kind(WORKFLOW)
        with self._db.statement() as conn:
            if not limited:
                return workflow_tasks.claim_workflow_tasks(conn, self._q, names, owner, now, lease, limit)
            # rate-limited queues: through starts reserved ahead, else their start slots (rate_limits.py)
            return rate_limits.claim_with_limits(
                conn,
                self._q,
                self._reservations,
                WORKFLOW,
                limited,
                now,
                limit,
                lambda reserved: rate_limits.claim_reserved_workflow_tasks(
                    conn, self._q, names, owner, now, lease, limit, reserved
                ),
                lambda: rate_limits.claim_workflow_tasks(conn, self._q, names, owner, now, lease, limit),
            )

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        with self._db.statement() as conn:
            return workflow_tasks.load_workflow_task(conn, self._q, task, now, after_seq)

    def load_workflow_tasks(self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime) -> list[Loaded]:
        with self._db.statement() as conn:
            return workflow_tasks.load_workflow_tasks(conn, self._q, requests, now)

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        if not retries:
            return []
        with self._db.statement() as conn:
            return workflow_tasks.retry_workflow_tasks(conn, self._q, retries, failure)

    def complete(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim | None
    ) -> tuple[list[bool], list[ActivityTask]]:
        """Write a batch of results; with ``claim``, claim the activity tasks they made due."""
        needed = [(spec.queue, ACTIVITY) for _, result in results for spec in result.activity_tasks]
        needed += [(child.created.queue, WORKFLOW) for _, result in results for child in result.child_runs]
        needed += [
            (run.created.queue, WORKFLOW)
            for _, result in results
            if result.effects is not None
            for run in result.effects.detached_runs
        ]
        with batch_refusals():  # the buffer splits a refused batch; see refusals.py
            self._queues.ensure_all(needed)
            with self._db.connection() as conn:
                return dispatch.complete_workflow_tasks_then_claim(conn, self._q, results, now, claim)


class PostgresActivityTasks:
    """The activity-task ports: schedule, claim, extend leases, complete (then claim), and the
    remote workers' read of claimed tasks by id."""

    def __init__(self, db: Database, q: Statements, limited: LimitedQueues, reservations: Reservations) -> None:
        self._db = db
        self._q = q
        self._limited = limited
        self._reservations = reservations

    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        with self._db.transaction() as conn:
            return activity_tasks.schedule_activity_tasks(conn, self._q, now, limit)

    def step_attempts(self, run_id: str, created_seqs: Collection[int] | None = None) -> list[StepAttempts]:
        with self._db.statement() as conn:
            return attempts.step_attempts(conn, self._q, run_id, created_seqs)

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        # asked before the claim's connection is taken: a read of the queues, once a second,
        # takes a connection of its own
        limited = self._limited.of_kind(ACTIVITY)
        with self._db.statement() as conn:
            if not limited:
                return activity_tasks.claim_activity_tasks(conn, self._q, names, owner, now, lease, limit)
            # rate-limited queues: through starts reserved ahead, else their start slots (rate_limits.py)
            return rate_limits.claim_with_limits(
                conn,
                self._q,
                self._reservations,
                ACTIVITY,
                limited,
                now,
                limit,
                lambda reserved: rate_limits.claim_reserved_activity_tasks(
                    conn, self._q, names, owner, now, lease, limit, reserved
                ),
                lambda: rate_limits.claim_activity_tasks(conn, self._q, names, owner, now, lease, limit),
            )

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        with batch_refusals(), self._db.statement() as conn:
            return activity_tasks.extend_activity_leases(conn, self._q, tasks, now, lease)

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        """The claimed tasks among ``task_ids`` (None for each that is not), for the complete,
        fail and heartbeat calls of a remote worker, which knows a task by its id alone."""
        with self._db.statement() as conn:
            return activity_tasks.find_activity_tasks(conn, self._q, task_ids)

    def complete(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim | None
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        """Write a batch of outcomes; with ``claim``, claim (and load) the workflow tasks of
        the runs they told."""
        if activity_outcomes.all_finished(outcomes):  # one call of the schema's function
            with batch_refusals(), self._db.statement() as conn:
                return activity_outcomes.complete_finished(conn, self._q, outcomes, now, claim)
        with batch_refusals(), self._db.connection() as conn:  # see refusals.py
            return dispatch.complete_activity_tasks_then_claim(conn, self._q, outcomes, now, claim)
