"""History events: everything that happened to a run, in the past tense.

A run's history is a sequence of :class:`HistoryEvent` with gapless sequence numbers from 1.
Events that reference an earlier one (an activity's outcome, an elapsed timer) carry that
event's sequence number as ``created_seq``; a child's outcome names the child run. Some events first wait in the run's inbox as messages
(:data:`MESSAGE_TYPES`) and enter the history when a workflow task consumes them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload

Labels = tuple[tuple[str, str], ...]


@attrs.frozen(kw_only=True)
class RunCreated:
    workflow_name: str
    input: tuple[Payload, ...]
    queue: str
    instance_id: str | None = None
    priority: int = 0
    concurrency_key: str | None = None
    labels: Labels = ()
    parent_run_id: str | None = None
    generation: int = 1
    # seeds ctx.random() and ctx.uuid4(): a history alone is enough to replay them
    random_seed: int = 0
    # the tracing context of whoever started the run (e.g. W3C traceparent), for its spans
    trace_context: Labels = ()
    # the code version of the engine that started the run (Engine(code_version=)); a child
    # run and a continued generation carry the version of the run that started them
    code_version: str | None = None
    # when the run is cancelled with reason "timeout" (start_workflow(timeout=), ctx.child(timeout=));
    # a continued generation keeps it: the deadline is the whole run's (docs/reference/contract.md §14)
    deadline: datetime | None = None
    # the streams an earlier generation closed: a continued generation's code knows them closed
    # (writing to one is a ValueError at the call, as in the generation that closed it)
    closed_streams: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RunStarted:
    pass


@attrs.frozen(kw_only=True)
class WorkflowTaskStarted:
    pass


@attrs.frozen(kw_only=True)
class WorkflowTaskCompleted:
    pass


@attrs.frozen(kw_only=True)
class ActivityTaskCreated:
    name: str
    input: tuple[Payload, ...]
    queue: str
    priority: int
    retry_policy: RetryPolicy
    lock_timeout: timedelta


@attrs.frozen(kw_only=True)
class ActivityTaskCompleted:
    created_seq: int
    result: Payload


@attrs.frozen(kw_only=True)
class ActivityTaskFailed:
    created_seq: int
    failure: FailureInfo


@attrs.frozen(kw_only=True)
class TimerCreated:
    fire_at: datetime


@attrs.frozen(kw_only=True)
class TimerElapsed:
    created_seq: int


@attrs.frozen(kw_only=True)
class ExternalEventReceived:
    event_id: str
    payload: Payload


@attrs.frozen(kw_only=True)
class ChildRunCreated:
    child_run_id: str
    workflow_name: str
    input: tuple[Payload, ...]
    queue: str
    instance_id: str | None = None
    priority: int = 0
    concurrency_key: str | None = None
    labels: Labels = ()
    deadline: datetime | None = None


@attrs.frozen(kw_only=True)
class ChildRunCompleted:
    child_run_id: str
    result: Payload


@attrs.frozen(kw_only=True)
class ChildRunFailed:
    child_run_id: str
    failure: FailureInfo


@attrs.frozen(kw_only=True)
class SideEffectExecuted:
    name: str
    result: Payload


@attrs.frozen(kw_only=True)
class PatchApplied:
    """Workflow code took the new branch of ``ctx.patched(patch_id)`` here (docs/reference/contract.md §11)."""

    patch_id: str


@attrs.frozen(kw_only=True)
class RunSuspended:
    pass


@attrs.frozen(kw_only=True)
class RunResumed:
    pass


@attrs.frozen(kw_only=True)
class RunCancelled:
    reason: str = ""


@attrs.frozen(kw_only=True)
class RunTerminated:
    """A hard stop (``engine.terminate``): no workflow code runs again; a ``RunCompleted`` with
    status TERMINATED follows in the same block."""

    reason: str = ""


@attrs.frozen(kw_only=True)
class UpdateRequested:
    """An update request waiting in the inbox; it never enters the history itself: the task
    that takes it records ``UpdateAccepted`` or, when the validator refuses it, nothing."""

    update_id: str
    name: str
    args: tuple[Payload, ...] = ()


@attrs.frozen(kw_only=True)
class UpdateAccepted:
    """An update request that passed its validator; its handler runs from here."""

    update_id: str
    name: str
    args: tuple[Payload, ...] = ()


@attrs.frozen(kw_only=True)
class UpdateCompleted:
    """The answer of an accepted update: the handler's result, or its failure."""

    update_id: str
    result: Payload | None = None
    failure: FailureInfo | None = None


@attrs.frozen(kw_only=True)
class ValuePublished:
    key: str
    value: Payload


@attrs.frozen(kw_only=True)
class StreamItemWritten:
    key: str
    value: Payload


@attrs.frozen(kw_only=True)
class StreamClosed:
    key: str


@attrs.frozen(kw_only=True)
class LabelsChanged:
    """``ctx.set_labels``: labels set (or replaced) and labels removed."""

    set: Labels = ()
    removed: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class CancelRequested:
    """Workflow code cancelled the activity, timer or child created at ``created_seq``."""

    created_seq: int


@attrs.frozen(kw_only=True)
class DetachedRunCreated:
    """``ctx.start_workflow``: an independent run (no parent; it outlives this one)."""

    run_id: str
    workflow_name: str
    input: tuple[Payload, ...]
    queue: str
    instance_id: str | None = None
    priority: int = 0
    concurrency_key: str | None = None
    labels: Labels = ()
    deadline: datetime | None = None


@attrs.frozen(kw_only=True)
class RunCompleted:
    """The one terminal outcome of a run; ``status`` says which."""

    status: RunStatus
    result: Payload | None = None
    failure: FailureInfo | None = None


Event = (
    RunCreated
    | RunStarted
    | WorkflowTaskStarted
    | WorkflowTaskCompleted
    | ActivityTaskCreated
    | ActivityTaskCompleted
    | ActivityTaskFailed
    | TimerCreated
    | TimerElapsed
    | ExternalEventReceived
    | ChildRunCreated
    | ChildRunCompleted
    | ChildRunFailed
    | SideEffectExecuted
    | PatchApplied
    | RunSuspended
    | RunResumed
    | RunCancelled
    | RunCompleted
    | RunTerminated
    | UpdateRequested
    | UpdateAccepted
    | UpdateCompleted
    | ValuePublished
    | StreamItemWritten
    | StreamClosed
    | LabelsChanged
    | CancelRequested
    | DetachedRunCreated
)

# Events that other parties send to a run; they wait in its inbox until a workflow task takes them.
Message = (
    RunStarted
    | ActivityTaskCompleted
    | ActivityTaskFailed
    | TimerElapsed
    | ExternalEventReceived
    | ChildRunCompleted
    | ChildRunFailed
    | RunSuspended
    | RunResumed
    | RunCancelled
    | RunTerminated
    | UpdateRequested
)
MESSAGE_TYPES: tuple[type, ...] = (
    RunStarted,
    ActivityTaskCompleted,
    ActivityTaskFailed,
    TimerElapsed,
    ExternalEventReceived,
    ChildRunCompleted,
    ChildRunFailed,
    RunSuspended,
    RunResumed,
    RunCancelled,
    RunTerminated,
    UpdateRequested,
)

# Events recorded in the message part of a block (before its commands): the inbox messages a task
# consumed, an update request as the UpdateAccepted it became. An UpdateRequested is never history.
RECORDED_MESSAGE_TYPES: tuple[type, ...] = (
    *(kind for kind in MESSAGE_TYPES if kind is not UpdateRequested),
    UpdateAccepted,
)

# Events that workflow code causes; replay matches them against what the code asks for.
COMMAND_EVENT_TYPES: tuple[type, ...] = (
    ActivityTaskCreated,
    TimerCreated,
    ChildRunCreated,
    SideEffectExecuted,
    PatchApplied,
    RunCompleted,
    UpdateCompleted,
    ValuePublished,
    StreamItemWritten,
    StreamClosed,
    LabelsChanged,
    CancelRequested,
    DetachedRunCreated,
)

EVENT_TYPES: tuple[type, ...] = (
    RunCreated,
    WorkflowTaskStarted,
    WorkflowTaskCompleted,
    *MESSAGE_TYPES,
    UpdateAccepted,
    *COMMAND_EVENT_TYPES,
)


@attrs.frozen(kw_only=True)
class HistoryEvent:
    """One entry of a run's history."""

    sequence_number: int
    timestamp: datetime
    event: Event

    @property
    def kind(self) -> str:
        """The event's class name, e.g. ``"ActivityTaskCompleted"``."""
        return type(self.event).__name__
