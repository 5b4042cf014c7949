"""Commands: what workflow code asks for, in the imperative.

Each command becomes one history event when it is first issued (:func:`to_event`), and on
replay is matched against the event recorded at its place (:func:`matches`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload


@attrs.frozen(kw_only=True)
class ScheduleActivity:
    name: str
    input: tuple[Payload, ...]
    queue: str
    priority: int
    retry_policy: RetryPolicy
    lock_timeout: timedelta


@attrs.frozen(kw_only=True)
class StartTimer:
    fire_at: datetime


@attrs.frozen(kw_only=True)
class StartChild:
    child_run_id: str
    workflow_name: str
    input: tuple[Payload, ...]
    queue: str
    instance_id: str | None
    priority: int
    concurrency_key: str | None
    labels: ev.Labels
    deadline: datetime | None = None


@attrs.frozen(kw_only=True)
class StartDetached:
    run_id: str
    workflow_name: str
    input: tuple[Payload, ...]
    queue: str
    instance_id: str | None
    priority: int
    concurrency_key: str | None
    labels: ev.Labels
    deadline: datetime | None = None


@attrs.frozen(kw_only=True)
class CompleteUpdate:
    update_id: str
    result: Payload | None = None
    failure: FailureInfo | None = None


@attrs.frozen(kw_only=True)
class PublishValue:
    key: str
    value: Payload


@attrs.frozen(kw_only=True)
class WriteStream:
    key: str
    value: Payload


@attrs.frozen(kw_only=True)
class CloseStream:
    key: str


@attrs.frozen(kw_only=True)
class ChangeLabels:
    set: ev.Labels
    removed: tuple[str, ...]


@attrs.frozen(kw_only=True)
class CancelStep:
    created_seq: int


@attrs.frozen(kw_only=True)
class RecordSideEffect:
    name: str
    result: Payload


@attrs.frozen(kw_only=True)
class RecordPatch:
    patch_id: str


@attrs.frozen(kw_only=True)
class CompleteRun:
    status: RunStatus
    result: Payload | None = None
    failure: FailureInfo | None = None


Command = (
    ScheduleActivity
    | StartTimer
    | StartChild
    | RecordSideEffect
    | RecordPatch
    | CompleteRun
    | StartDetached
    | CompleteUpdate
    | PublishValue
    | WriteStream
    | CloseStream
    | ChangeLabels
    | CancelStep
)


def to_event(command: Command) -> ev.Event:
    """The history event that records ``command``."""
    # by exact type, in one lookup: this runs for every command of every task
    make = _TO_EVENT.get(type(command))
    if make is None:
        raise TypeError(f"not a command: {command!r}")  # pragma: no cover
    return make(command)


def _activity_created(command: ScheduleActivity) -> ev.Event:
    return ev.ActivityTaskCreated(
        name=command.name,
        input=command.input,
        queue=command.queue,
        priority=command.priority,
        retry_policy=command.retry_policy,
        lock_timeout=command.lock_timeout,
    )


def _child_created(command: StartChild) -> ev.Event:
    return ev.ChildRunCreated(
        child_run_id=command.child_run_id,
        workflow_name=command.workflow_name,
        input=command.input,
        queue=command.queue,
        instance_id=command.instance_id,
        priority=command.priority,
        concurrency_key=command.concurrency_key,
        labels=command.labels,
        deadline=command.deadline,
    )


def _detached_created(command: StartDetached) -> ev.Event:
    return ev.DetachedRunCreated(
        run_id=command.run_id,
        workflow_name=command.workflow_name,
        input=command.input,
        queue=command.queue,
        instance_id=command.instance_id,
        priority=command.priority,
        concurrency_key=command.concurrency_key,
        labels=command.labels,
        deadline=command.deadline,
    )


_TO_EVENT: dict[type, Callable[[Any], ev.Event]] = {
    ScheduleActivity: _activity_created,
    CompleteRun: lambda c: ev.RunCompleted(status=c.status, result=c.result, failure=c.failure),
    StartTimer: lambda c: ev.TimerCreated(fire_at=c.fire_at),
    StartChild: _child_created,
    RecordSideEffect: lambda c: ev.SideEffectExecuted(name=c.name, result=c.result),
    StartDetached: _detached_created,
    CompleteUpdate: lambda c: ev.UpdateCompleted(update_id=c.update_id, result=c.result, failure=c.failure),
    PublishValue: lambda c: ev.ValuePublished(key=c.key, value=c.value),
    WriteStream: lambda c: ev.StreamItemWritten(key=c.key, value=c.value),
    CloseStream: lambda c: ev.StreamClosed(key=c.key),
    ChangeLabels: lambda c: ev.LabelsChanged(set=c.set, removed=c.removed),
    CancelStep: lambda c: ev.CancelRequested(created_seq=c.created_seq),
    RecordPatch: lambda c: ev.PatchApplied(patch_id=c.patch_id),
}


def describe_command(command: Command) -> str:
    """A short text naming a command, for non-determinism messages."""
    return describe_event(to_event(command))


def describe_event(event: ev.Event) -> str:
    """A short text naming a command event (recorded, or what a command would record)."""
    match event:
        case ev.ActivityTaskCreated():
            return f"activity {event.name!r}"
        case ev.TimerCreated():
            return f"timer firing at {event.fire_at.isoformat()}"
        case ev.ChildRunCreated():
            return f"child workflow {event.workflow_name!r}"
        case ev.SideEffectExecuted():
            return f"side effect {event.name!r}"
        case ev.PatchApplied():
            return f"patch {event.patch_id!r}"
        case ev.RunCompleted():
            return f"run completion ({event.status.value})"
        case ev.DetachedRunCreated():
            return f"workflow start {event.workflow_name!r}"
        case ev.UpdateCompleted():
            return f"answer to update {event.update_id!r}"
        case ev.ValuePublished():
            return f"published value {event.key!r}"
        case ev.StreamItemWritten():
            return f"item of stream {event.key!r}"
        case ev.StreamClosed():
            return f"close of stream {event.key!r}"
        case ev.LabelsChanged():
            return "label change"
        case ev.CancelRequested():
            return f"cancel of step {event.created_seq}"
    return type(event).__name__


def matches(command: Command, recorded: ev.Event) -> str | None:
    """None when ``command`` is what ``recorded`` says was issued, else what differs."""
    match command:
        case ScheduleActivity():
            if not isinstance(recorded, ev.ActivityTaskCreated) or recorded.name != command.name:
                return "step"
            if recorded.input != command.input:
                return "arguments"
            return None
        case StartTimer():
            if not isinstance(recorded, ev.TimerCreated):
                return "step"
            return None if recorded.fire_at == command.fire_at else "timer duration"
        case StartChild():
            if not isinstance(recorded, ev.ChildRunCreated) or recorded.workflow_name != command.workflow_name:
                return "step"
            return None if recorded.input == command.input else "arguments"
        case RecordSideEffect():
            if not isinstance(recorded, ev.SideEffectExecuted) or recorded.name != command.name:
                return "step"
            return None
        case RecordPatch():
            if not isinstance(recorded, ev.PatchApplied) or recorded.patch_id != command.patch_id:
                return "step"
            return None
        case CompleteRun():
            if not isinstance(recorded, ev.RunCompleted) or recorded.status != command.status:
                return "step"
            return None
        case StartDetached():
            if not isinstance(recorded, ev.DetachedRunCreated) or recorded.workflow_name != command.workflow_name:
                return "step"
            return None if recorded.input == command.input else "arguments"
        case CompleteUpdate():
            # the answer itself is not compared: like a side effect's result, what was recorded stands
            if not isinstance(recorded, ev.UpdateCompleted) or recorded.update_id != command.update_id:
                return "step"
            return None
        case PublishValue():
            if not isinstance(recorded, ev.ValuePublished) or recorded.key != command.key:
                return "step"
            return None if recorded.value == command.value else "value"
        case WriteStream():
            if not isinstance(recorded, ev.StreamItemWritten) or recorded.key != command.key:
                return "step"
            return None if recorded.value == command.value else "value"
        case CloseStream():
            return None if isinstance(recorded, ev.StreamClosed) and recorded.key == command.key else "step"
        case ChangeLabels():
            if not isinstance(recorded, ev.LabelsChanged):
                return "step"
            return None if (recorded.set, recorded.removed) == (command.set, command.removed) else "labels"
        case CancelStep():
            if not isinstance(recorded, ev.CancelRequested) or recorded.created_seq != command.created_seq:
                return "step"
            return None
    raise TypeError(f"not a command: {command!r}")  # pragma: no cover
