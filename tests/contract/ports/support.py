"""What every port contract shares: a fresh store per test, per backend, and domain values.

A contract is a plain class of tests (``RunStoreContract``, ...) that asks for a ``store`` and a
``clock``; it is collected only through its subclasses, one per backend, which mix in
:class:`MemoryBackend` or :class:`PostgresBackend` (the way pyeventsourcing subclasses its
recorder tests per persistence module). A new adapter proves itself by one more mixin.

The helpers build what the engine would hand a store — ``RunCreated`` events, workflow-task
results, activity outcomes — from :mod:`dex.domain` values, so the ports are driven directly,
without an engine in between.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest

from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivityOutcome, ActivityTask, Lease, Store, WorkflowTask
from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, NewActivityTask, NewRun, OutgoingMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo, Payload
from dex.testing import VirtualClock

WF = "checkout"  # the workflow every contract runs, unless a test names another
ACT = "charge"  # the activity its tasks schedule
QUEUE = "default"
LEASE = timedelta(seconds=30)
LOCK_TIMEOUT = timedelta(minutes=5)


class PortContract:
    """The fixtures of every contract: a virtual clock and a fresh, empty store over it."""

    def open_store(self, clock: VirtualClock) -> AbstractContextManager[Store]:
        raise NotImplementedError  # a backend mixin provides it

    @pytest.fixture
    def clock(self) -> VirtualClock:
        return VirtualClock()

    @pytest.fixture
    def store(self, clock: VirtualClock) -> Iterator[Store]:
        with self.open_store(clock) as store:
            yield store


class MemoryBackend:
    @contextmanager
    def open_store(self, clock: VirtualClock) -> Iterator[Store]:
        yield InMemoryAdapter(clock=clock)


class PostgresBackend:
    """A PostgresAdapter over a schema of the test's own on the session's server."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.postgres]

    @contextmanager
    def open_store(self, clock: VirtualClock) -> Iterator[Store]:
        from dex.adapters.postgres import PostgresAdapter
        from tests.pg import fresh_schema, postgres_dsn

        dsn = postgres_dsn()
        with fresh_schema(dsn) as schema:
            store = PostgresAdapter(dsn, schema=schema, clock=clock, max_connections=2)
            try:
                yield store
            finally:
                store.close()


# -- values ----------------------------------------------------------------------------------
def payload(value: object) -> Payload:
    return Payload(encoding="json/plain", data=repr(value).encode())


def created(
    workflow: str = WF,
    *,
    queue: str = QUEUE,
    instance_id: str | None = None,
    priority: int = 0,
    key: str | None = None,
    labels: ev.Labels = (),
    parent: str | None = None,
) -> ev.RunCreated:
    return ev.RunCreated(
        workflow_name=workflow,
        input=(payload(1),),
        queue=queue,
        instance_id=instance_id,
        priority=priority,
        concurrency_key=key,
        labels=labels,
        parent_run_id=parent,
    )


def event(event_id: str) -> ev.ExternalEventReceived:
    return ev.ExternalEventReceived(event_id=event_id, payload=payload(event_id))


def kinds(inbox: Sequence[InboxMessage]) -> list[str]:
    """The inbox as names: an external event by its id, anything else by its kind."""
    return [
        m.event.event_id if isinstance(m.event, ev.ExternalEventReceived) else type(m.event).__name__ for m in inbox
    ]


def failure(message: str = "card declined") -> FailureInfo:
    return FailureInfo(type="ApplicationError", message=message, terminal=True)


# -- driving runs by hand ------------------------------------------------------------------------
def start(store: Store, clock: VirtualClock, run_id: str, **fields: object) -> str:
    return store.create_run(run_id, created(**fields), clock.now())  # type: ignore[arg-type]


def claim(
    store: Store, clock: VirtualClock, owner: str = "w1", names: Sequence[str] = (WF,), limit: int = 100
) -> list[WorkflowTask]:
    return store.claim_workflow_tasks(frozenset(names), owner, clock.now(), LEASE, limit)


def next_task(store: Store, clock: VirtualClock, run_id: str, owner: str = "w1") -> WorkflowTask:
    """Schedule and claim the run's workflow task; the other tasks claimed on the way are given
    back at once, claimable again as before."""
    store.schedule_workflow_tasks(clock.now(), 100)
    tasks = claim(store, clock, owner)
    others = [(t, clock.now()) for t in tasks if t.run_id != run_id]
    assert store.retry_workflow_tasks(others, clock.now()) == [True] * len(others)
    (task,) = [t for t in tasks if t.run_id == run_id]
    return task


def decide(
    store: Store,
    task: WorkflowTask,
    now: datetime,
    *,
    activities: Sequence[str] = (),
    timers: Sequence[datetime] = (),
    send: Sequence[tuple[str, ev.Message]] = (),
    children: Sequence[NewRun] = (),
    complete: RunStatus | None = None,
    status: str | None = None,
    priority: int = 0,
    queue: str = QUEUE,
) -> WorkflowTaskResult:
    """What a workflow task that consumes the whole visible inbox and issues these commands
    writes: a block of history after the run's last event, and its effects."""
    history, inbox = store.load_workflow_task(task, now)
    last = history[-1].sequence_number
    events: list[ev.Event] = [ev.WorkflowTaskStarted(), *(m.event for m in inbox)]
    specs, messages = [], [OutgoingMessage(run_id=r, event=m, visible_from=now) for r, m in send]
    for name in activities:
        events.append(
            ev.ActivityTaskCreated(
                name=name,
                input=(payload(name),),
                queue=queue,
                priority=priority,
                retry_policy=RetryPolicy(),
                lock_timeout=LOCK_TIMEOUT,
            )
        )
        specs.append(
            NewActivityTask(
                run_id=task.run_id,
                created_seq=last + len(events),
                name=name,
                input=(payload(name),),
                queue=queue,
                priority=priority,
                retry_policy=RetryPolicy(),
                lock_timeout=LOCK_TIMEOUT,
                visible_from=now,
            )
        )
    for fire_at in timers:
        events.append(ev.TimerCreated(fire_at=fire_at))
        elapsed = ev.TimerElapsed(created_seq=last + len(events))
        messages.append(OutgoingMessage(run_id=task.run_id, event=elapsed, visible_from=fire_at))
    for child in children:
        events.append(ev.ChildRunCreated(child_run_id=child.run_id, workflow_name=WF, input=(), queue=QUEUE))
    completion = None
    if complete is not None:
        completion = ev.RunCompleted(
            status=complete,
            result=payload("done") if complete is RunStatus.COMPLETED else None,
            failure=failure() if complete is RunStatus.FAILED else None,
        )
        events.append(completion)
    events.append(ev.WorkflowTaskCompleted())
    return WorkflowTaskResult(
        run_id=task.run_id,
        expected_last_seq=last,
        new_events=tuple(
            ev.HistoryEvent(sequence_number=last + 1 + i, timestamp=now, event=e) for i, e in enumerate(events)
        ),
        consumed=tuple(m.message_id for m in inbox),
        started=True,
        completion=completion,
        custom_status=status,
        activity_tasks=tuple(specs),
        messages=tuple(messages),
        child_runs=tuple(children),
    )


def step(store: Store, clock: VirtualClock, run_id: str, **commands: object) -> WorkflowTaskResult:
    """Run one workflow task of the run to its end: schedule, claim, decide, complete."""
    task = next_task(store, clock, run_id)
    result = decide(store, task, clock.now(), **commands)  # type: ignore[arg-type]
    assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
    return result


def finish(store: Store, clock: VirtualClock, run_id: str, status: RunStatus = RunStatus.COMPLETED) -> None:
    """End the run with ``status`` by a workflow task of its own (woken by an event)."""
    store.send_message(run_id, event("end"), clock.now())
    step(store, clock, run_id, complete=status)


def activity(
    store: Store, clock: VirtualClock, owner: str = "a1", names: Sequence[str] = (ACT,), limit: int = 100
) -> list[ActivityTask]:
    """Make due activity tasks claimable and claim them."""
    store.schedule_activity_tasks(clock.now(), 100)
    return store.claim_activity_tasks(frozenset(names), owner, clock.now(), LEASE, limit)


def done(task: ActivityTask, value: object = 42) -> ActivityOutcome:
    return ActivityOutcome(task=task, result=payload(value))


def inbox_of(store: Store, clock: VirtualClock, run_id: str) -> list[str]:
    """The run's visible inbox now, as a workflow task of it would load it (:func:`kinds`)."""
    return kinds(store.load_workflow_task(task_of(run_id), clock.now())[1])


def task_of(run_id: str) -> WorkflowTask:
    """A workflow task of the run as a value (loads read by run; nothing is claimed)."""
    return WorkflowTask(
        task_id=0, run_id=run_id, workflow_name=WF, queue=QUEUE, lease=Lease(owner="-", until=EPOCH, version=0)
    )


EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
