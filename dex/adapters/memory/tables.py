"""The in-memory adapter's rows: plain mutable records guarded by the adapter's lock."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from dex.app.ports.store import ActivityTask, Lease, RunRecord, WorkflowTask
from dex.domain import events as ev
from dex.domain.queue_limits import RateLimit, slot_is_free
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload


@attrs.define(kw_only=True)
class RunRow:
    run_id: str
    position: int  # creation order, which breaks ties between runs created at the same instant
    created: ev.RunCreated
    status: RunStatus
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    custom_status: str | None = None
    result: Payload | None = None
    failure: FailureInfo | None = None
    holds_key: bool = False
    task_failure: FailureInfo | None = None
    forked_from: str | None = None
    labels: ev.Labels | None = None  # as ctx.set_labels left them; None: those it was created with
    unread_events: int = 0
    history: list[ev.HistoryEvent] = attrs.Factory(list)

    @property
    def current_labels(self) -> ev.Labels:
        return self.created.labels if self.labels is None else self.labels

    def record(self) -> RunRecord:
        c = self.created
        return RunRecord(
            run_id=self.run_id,
            workflow_name=c.workflow_name,
            queue=c.queue,
            status=self.status,
            instance_id=c.instance_id,
            priority=c.priority,
            concurrency_key=c.concurrency_key,
            labels=self.current_labels,
            parent_run_id=c.parent_run_id,
            created_at=self.created_at,
            started_at=self.started_at,
            completed_at=self.completed_at,
            custom_status=self.custom_status,
            result=self.result,
            failure=self.failure,
            code_version=c.code_version,
            task_failure=self.task_failure,
            forked_from=self.forked_from,
            deadline=c.deadline,
            unread_events=self.unread_events,
        )


@attrs.define(kw_only=True)
class InboxRow:
    message_id: int
    run_id: str
    event: ev.Message
    visible_from: datetime


@attrs.define(kw_only=True)
class LeaseFields:
    owner: str | None = None
    until: datetime | None = None
    version: int = 0

    def held(self, now: datetime) -> bool:
        return self.owner is not None and self.until is not None and self.until > now

    def take(self, owner: str, until: datetime) -> Lease:
        self.owner, self.until, self.version = owner, until, self.version + 1
        return Lease(owner=owner, until=until, version=self.version)

    def is_(self, lease: Lease) -> bool:
        return self.owner == lease.owner and self.version == lease.version

    def clear(self) -> None:
        self.owner, self.until = None, None


@attrs.define(kw_only=True)
class WorkflowTaskRow:
    task_id: int
    run_id: str
    workflow_name: str
    queue: str
    priority: int
    lease: LeaseFields = attrs.Factory(LeaseFields)

    def claimed(self) -> WorkflowTask:
        assert self.lease.owner is not None and self.lease.until is not None
        return WorkflowTask(
            task_id=self.task_id,
            run_id=self.run_id,
            workflow_name=self.workflow_name,
            queue=self.queue,
            lease=Lease(owner=self.lease.owner, until=self.lease.until, version=self.lease.version),
        )


CREATED, QUEUED = "CREATED", "QUEUED"


@attrs.define(kw_only=True)
class ActivityTaskRow:
    task_id: int
    run_id: str
    created_seq: int
    name: str
    input: tuple[Payload, ...]
    queue: str
    priority: int
    retry_policy: RetryPolicy
    lock_timeout: timedelta
    visible_from: datetime
    attempt: int = 1
    trace_context: ev.Labels = ()
    state: str = CREATED  # CREATED (waiting to become visible), QUEUED (claimable or claimed)
    lease: LeaseFields = attrs.Factory(LeaseFields)

    def claimed(self) -> ActivityTask:
        assert self.lease.owner is not None and self.lease.until is not None
        return ActivityTask(
            task_id=self.task_id,
            run_id=self.run_id,
            created_seq=self.created_seq,
            name=self.name,
            input=self.input,
            queue=self.queue,
            priority=self.priority,
            attempt=self.attempt,
            retry_policy=self.retry_policy,
            lock_timeout=self.lock_timeout,
            lease=Lease(owner=self.lease.owner, until=self.lease.until, version=self.lease.version),
            trace_context=self.trace_context,
        )


@attrs.define(kw_only=True)
class QueueRow:
    name: str
    kind: str
    capacity: int
    paused: bool = False
    key_concurrency: int = 1
    rate_limit: RateLimit | None = None
    # with a rate limit, the last start through each of its slots (None: never; queue_limits.py)
    starts: list[datetime | None] = attrs.field(factory=list)

    @property
    def held_back(self) -> bool:
        """Whether the paths that start a task without a claim's start slot keep off the queue
        (a new run's first task claimed with it, an answered step, an inline attempt): when it is
        paused, and when it has a rate limit (as PostgreSQL's generated ``paused`` column)."""
        return self.paused or self.rate_limit is not None

    def limit_rate(self, limit: RateLimit | None) -> None:
        """Set the rate limit; slots are kept (with their last starts) or added, up to its count."""
        self.rate_limit = limit
        count = limit.starts if limit is not None else 0
        self.starts = self.starts[:count] + [None] * (count - len(self.starts))

    def take_start(self, now: datetime) -> bool:
        """Whether a task of the queue may start at ``now``; if so, the start takes its slot."""
        if self.rate_limit is None:
            return True
        for n, last in enumerate(self.starts):
            if slot_is_free(last, now, self.rate_limit.period):
                self.starts[n] = now
                return True
        return False


@attrs.define(kw_only=True)
class StreamRow:
    """One stream of a run: its items in the order written (item n at position n + 1)."""

    items: list[Payload] = attrs.Factory(list)
    closed: bool = False


@attrs.define(kw_only=True)
class PublishedRow:
    """The latest value a run published under one key, and how many times the key was published."""

    value: Payload
    version: int
