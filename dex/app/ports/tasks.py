"""The records of claimed tasks that the ports pass around: leases, workflow and activity
tasks, and an activity attempt's outcome (re-exported by :mod:`dex.app.ports.store`)."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.values import FailureInfo, Payload


@attrs.frozen(kw_only=True)
class Lease:
    """Who holds a task and until when; ``version`` grows with every claim."""

    owner: str
    until: datetime
    version: int


@attrs.frozen(kw_only=True)
class WorkflowTask:
    task_id: int
    run_id: str
    workflow_name: str
    queue: str
    lease: Lease


@attrs.frozen(kw_only=True)
class ActivityTask:
    task_id: int
    run_id: str
    created_seq: int
    name: str
    input: tuple[Payload, ...]
    queue: str
    priority: int
    attempt: int
    retry_policy: RetryPolicy
    lock_timeout: timedelta
    lease: Lease
    trace_context: ev.Labels = ()


@attrs.frozen(kw_only=True)
class ActivityOutcome:
    """How an activity attempt ended: a result, a final failure, or a retry at ``retry_at``.

    A retry with ``counts`` False is the same attempt again: the machinery failed it (the store,
    during a transaction step's own transaction), not the activity, so it does not use up one of
    the retry policy's attempts (docs/reference/contract.md §8)."""

    task: ActivityTask
    result: Payload | None = None
    failure: FailureInfo | None = None
    retry_at: datetime | None = None
    counts: bool = True

    @property
    def message(self) -> ev.Message | None:
        """The message the run receives, or None for a retry (retried attempts are not history)."""
        if self.retry_at is not None:
            return None
        if self.failure is not None:
            return ev.ActivityTaskFailed(created_seq=self.task.created_seq, failure=self.failure)
        assert self.result is not None
        return ev.ActivityTaskCompleted(created_seq=self.task.created_seq, result=self.result)


@attrs.frozen(kw_only=True)
class AnsweredStep(WorkflowTask):
    """The workflow task an activity's outcome would make, decided without one: the engine that
    ran the attempt holds the run's executor, so it applies the outcome to it at once, and one
    write records outcome and step ("one write per activity", :mod:`dex.app.workflows.answers`).

    No store holds this task: ``task_id`` is the activity task's id negated (never a workflow
    task's), ``lease.version`` the activity claim's, ``last_seq`` where the executor stood. Its
    result goes through ``complete_workflow_tasks`` like any workflow task's, and applies only
    if the activity's claim (``outcome.task.lease``) still holds, the run's history ends at
    ``expected_last_seq``, the run is RUNNING with no workflow task and no visible inbox message
    (what it was sent comes first), and its workflow queue is not paused. (Its room does not
    count: the step takes no slot of the queue.) Then the activity task is deleted and the
    outcome's message is in the result's history, never in the inbox. Otherwise nothing of it
    is written, the activity task stays as it was, and the engine writes the outcome the
    ordinary way."""

    outcome: ActivityOutcome
    last_seq: int


# An activity task's lease, kept alive by the engine running its attempt (dex/app/activities/leases.py):
# the tasks of a process that died are taken over within about this long
DEFAULT_ACTIVITY_LEASE = timedelta(seconds=30)
