"""Commands: what workflow code asks for, in the imperative.

Each command becomes one history event when it is first issued (:func:`to_event`), and on
replay is matched against the event recorded at its place (:func:`matches`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

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


Command = ScheduleActivity | StartTimer | StartChild | RecordSideEffect | RecordPatch | CompleteRun


def to_event(command: Command) -> ev.Event:
    """The history event that records ``command``."""
    match command:
        case ScheduleActivity():
            return ev.ActivityTaskCreated(
                name=command.name,
                input=command.input,
                queue=command.queue,
                priority=command.priority,
                retry_policy=command.retry_policy,
                lock_timeout=command.lock_timeout,
            )
        case StartTimer():
            return ev.TimerCreated(fire_at=command.fire_at)
        case StartChild():
            return ev.ChildRunCreated(
                child_run_id=command.child_run_id,
                workflow_name=command.workflow_name,
                input=command.input,
                queue=command.queue,
                instance_id=command.instance_id,
                priority=command.priority,
                concurrency_key=command.concurrency_key,
                labels=command.labels,
            )
        case RecordSideEffect():
            return ev.SideEffectExecuted(name=command.name, result=command.result)
        case RecordPatch():
            return ev.PatchApplied(patch_id=command.patch_id)
        case CompleteRun():
            return ev.RunCompleted(status=command.status, result=command.result, failure=command.failure)
    raise TypeError(f"not a command: {command!r}")  # pragma: no cover


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
    raise TypeError(f"not a command: {command!r}")  # pragma: no cover
