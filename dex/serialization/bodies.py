"""Event bodies: each kind of domain event to the ``dex.v1`` message of the same name, and back.

The history codec (``dex.serialization.history``) wraps these bodies in a ``HistoryEvent``
(with its sequence number and timestamp) or an ``InboxMessage``. A ``match`` over every event
kind, with ``assert_never``, lets mypy prove that none is forgotten; a message that lacks a
required field raises ``ValueError`` naming where it was read.
"""

from __future__ import annotations

from datetime import datetime
from typing import assert_never

from google.protobuf.message import Message as ProtoMessage
from google.protobuf.timestamp_pb2 import Timestamp

from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.serialization.values import (
    datetime_from_proto,
    datetime_to_proto,
    decode_retry_policy,
    failure_from_proto,
    failure_to_proto,
    payload_from_proto,
    payload_to_proto,
    payloads_from_proto,
    payloads_to_proto,
    required_field,
    retry_policy_to_proto,
    timedelta_from_proto,
    timedelta_to_proto,
)
from dex.v1 import history_pb2

_STATUS_TO_PROTO: dict[RunStatus, history_pb2.RunStatus.ValueType] = {
    RunStatus.CREATED: history_pb2.RUN_STATUS_CREATED,
    RunStatus.RUNNING: history_pb2.RUN_STATUS_RUNNING,
    RunStatus.SUSPENDED: history_pb2.RUN_STATUS_SUSPENDED,
    RunStatus.COMPLETED: history_pb2.RUN_STATUS_COMPLETED,
    RunStatus.FAILED: history_pb2.RUN_STATUS_FAILED,
    RunStatus.CANCELLED: history_pb2.RUN_STATUS_CANCELLED,
    RunStatus.TERMINATED: history_pb2.RUN_STATUS_TERMINATED,
}
_STATUS_FROM_PROTO = {number: status for status, number in _STATUS_TO_PROTO.items()}


def body_to_proto(event: ev.Event) -> tuple[str, ProtoMessage]:
    """The oneof field name and message for an event; mypy checks that every kind is here."""
    match event:
        case ev.RunCreated():
            return "run_created", history_pb2.RunCreated(
                workflow_name=event.workflow_name,
                input=payloads_to_proto(event.input),
                queue=event.queue,
                instance_id=event.instance_id,
                priority=event.priority,
                concurrency_key=event.concurrency_key,
                labels=_labels_to_proto(event.labels),
                parent_run_id=event.parent_run_id,
                generation=event.generation,
                random_seed=event.random_seed,
                trace_context=_labels_to_proto(event.trace_context),
                code_version=event.code_version,
                deadline=_optional_datetime(event.deadline),
                closed_streams=event.closed_streams,
            )
        case ev.RunStarted():
            return "run_started", history_pb2.RunStarted()
        case ev.WorkflowTaskStarted():
            return "workflow_task_started", history_pb2.WorkflowTaskStarted()
        case ev.WorkflowTaskCompleted():
            return "workflow_task_completed", history_pb2.WorkflowTaskCompleted()
        case ev.ActivityTaskCreated():
            return "activity_task_created", history_pb2.ActivityTaskCreated(
                name=event.name,
                input=payloads_to_proto(event.input),
                queue=event.queue,
                priority=event.priority,
                retry_policy=retry_policy_to_proto(event.retry_policy),
                lock_timeout=timedelta_to_proto(event.lock_timeout),
            )
        case ev.ActivityTaskCompleted():
            return "activity_task_completed", history_pb2.ActivityTaskCompleted(
                created_seq=event.created_seq, result=payload_to_proto(event.result)
            )
        case ev.ActivityTaskFailed():
            return "activity_task_failed", history_pb2.ActivityTaskFailed(
                created_seq=event.created_seq, failure=failure_to_proto(event.failure)
            )
        case ev.TimerCreated():
            return "timer_created", history_pb2.TimerCreated(fire_at=datetime_to_proto(event.fire_at))
        case ev.TimerElapsed():
            return "timer_elapsed", history_pb2.TimerElapsed(created_seq=event.created_seq)
        case ev.ExternalEventReceived():
            return "external_event_received", history_pb2.ExternalEventReceived(
                event_id=event.event_id, payload=payload_to_proto(event.payload)
            )
        case ev.ChildRunCreated():
            return "child_run_created", history_pb2.ChildRunCreated(
                child_run_id=event.child_run_id,
                workflow_name=event.workflow_name,
                input=payloads_to_proto(event.input),
                queue=event.queue,
                instance_id=event.instance_id,
                priority=event.priority,
                concurrency_key=event.concurrency_key,
                labels=_labels_to_proto(event.labels),
                deadline=_optional_datetime(event.deadline),
            )
        case ev.ChildRunCompleted():
            return "child_run_completed", history_pb2.ChildRunCompleted(
                child_run_id=event.child_run_id, result=payload_to_proto(event.result)
            )
        case ev.ChildRunFailed():
            return "child_run_failed", history_pb2.ChildRunFailed(
                child_run_id=event.child_run_id, failure=failure_to_proto(event.failure)
            )
        case ev.SideEffectExecuted():
            return "side_effect_executed", history_pb2.SideEffectExecuted(
                name=event.name, result=payload_to_proto(event.result)
            )
        case ev.PatchApplied():
            return "patch_applied", history_pb2.PatchApplied(patch_id=event.patch_id)
        case ev.RunSuspended():
            return "run_suspended", history_pb2.RunSuspended()
        case ev.RunResumed():
            return "run_resumed", history_pb2.RunResumed()
        case ev.RunCancelled():
            return "run_cancelled", history_pb2.RunCancelled(reason=event.reason)
        case ev.RunCompleted():
            return "run_completed", history_pb2.RunCompleted(
                status=_STATUS_TO_PROTO[event.status],
                result=None if event.result is None else payload_to_proto(event.result),
                failure=None if event.failure is None else failure_to_proto(event.failure),
            )
        case ev.RunTerminated():
            return "run_terminated", history_pb2.RunTerminated(reason=event.reason)
        case ev.UpdateRequested():
            return "update_requested", history_pb2.UpdateRequested(
                update_id=event.update_id, name=event.name, args=payloads_to_proto(event.args)
            )
        case ev.UpdateAccepted():
            return "update_accepted", history_pb2.UpdateAccepted(
                update_id=event.update_id, name=event.name, args=payloads_to_proto(event.args)
            )
        case ev.UpdateCompleted():
            return "update_completed", history_pb2.UpdateCompleted(
                update_id=event.update_id,
                result=None if event.result is None else payload_to_proto(event.result),
                failure=None if event.failure is None else failure_to_proto(event.failure),
            )
        case ev.ValuePublished():
            return "value_published", history_pb2.ValuePublished(key=event.key, value=payload_to_proto(event.value))
        case ev.StreamItemWritten():
            return "stream_item_written", history_pb2.StreamItemWritten(
                key=event.key, value=payload_to_proto(event.value)
            )
        case ev.StreamClosed():
            return "stream_closed", history_pb2.StreamClosed(key=event.key)
        case ev.LabelsChanged():
            return "labels_changed", history_pb2.LabelsChanged(
                set=_labels_to_proto(event.set), removed=list(event.removed)
            )
        case ev.CancelRequested():
            return "cancel_requested", history_pb2.CancelRequested(created_seq=event.created_seq)
        case ev.DetachedRunCreated():
            return "detached_run_created", history_pb2.DetachedRunCreated(
                run_id=event.run_id,
                workflow_name=event.workflow_name,
                input=payloads_to_proto(event.input),
                queue=event.queue,
                instance_id=event.instance_id,
                priority=event.priority,
                concurrency_key=event.concurrency_key,
                labels=_labels_to_proto(event.labels),
                deadline=_optional_datetime(event.deadline),
            )
        case _:
            assert_never(event)


def body_from_proto(body: ProtoMessage, where: str) -> ev.Event:
    """The domain event for one of the per-kind messages; ``ValueError`` if a field is missing."""
    match body:
        case history_pb2.RunCreated():
            return ev.RunCreated(
                workflow_name=body.workflow_name,
                input=payloads_from_proto(body.input),
                queue=body.queue,
                instance_id=body.instance_id if body.HasField("instance_id") else None,
                priority=body.priority,
                concurrency_key=body.concurrency_key if body.HasField("concurrency_key") else None,
                labels=tuple((label.key, label.value) for label in body.labels),
                parent_run_id=body.parent_run_id if body.HasField("parent_run_id") else None,
                generation=body.generation,
                random_seed=body.random_seed,
                trace_context=tuple((label.key, label.value) for label in body.trace_context),
                code_version=body.code_version if body.HasField("code_version") else None,
                deadline=datetime_from_proto(body.deadline) if body.HasField("deadline") else None,
                closed_streams=tuple(body.closed_streams),
            )
        case history_pb2.RunStarted():
            return ev.RunStarted()
        case history_pb2.WorkflowTaskStarted():
            return ev.WorkflowTaskStarted()
        case history_pb2.WorkflowTaskCompleted():
            return ev.WorkflowTaskCompleted()
        case history_pb2.ActivityTaskCreated():
            return ev.ActivityTaskCreated(
                name=body.name,
                input=payloads_from_proto(body.input),
                queue=body.queue,
                priority=body.priority,
                # through the decoded policies kept by their bytes: an activity's calls share one
                retry_policy=decode_retry_policy(required_field(body, "retry_policy", where).SerializeToString()),
                lock_timeout=timedelta_from_proto(required_field(body, "lock_timeout", where)),
            )
        case history_pb2.ActivityTaskCompleted():
            return ev.ActivityTaskCompleted(
                created_seq=body.created_seq, result=payload_from_proto(required_field(body, "result", where))
            )
        case history_pb2.ActivityTaskFailed():
            return ev.ActivityTaskFailed(
                created_seq=body.created_seq, failure=failure_from_proto(required_field(body, "failure", where))
            )
        case history_pb2.TimerCreated():
            return ev.TimerCreated(fire_at=datetime_from_proto(required_field(body, "fire_at", where)))
        case history_pb2.TimerElapsed():
            return ev.TimerElapsed(created_seq=body.created_seq)
        case history_pb2.ExternalEventReceived():
            return ev.ExternalEventReceived(
                event_id=body.event_id, payload=payload_from_proto(required_field(body, "payload", where))
            )
        case history_pb2.ChildRunCreated():
            return ev.ChildRunCreated(
                child_run_id=body.child_run_id,
                workflow_name=body.workflow_name,
                input=payloads_from_proto(body.input),
                queue=body.queue,
                instance_id=body.instance_id if body.HasField("instance_id") else None,
                priority=body.priority,
                concurrency_key=body.concurrency_key if body.HasField("concurrency_key") else None,
                labels=tuple((label.key, label.value) for label in body.labels),
                deadline=datetime_from_proto(body.deadline) if body.HasField("deadline") else None,
            )
        case history_pb2.ChildRunCompleted():
            return ev.ChildRunCompleted(
                child_run_id=body.child_run_id, result=payload_from_proto(required_field(body, "result", where))
            )
        case history_pb2.ChildRunFailed():
            return ev.ChildRunFailed(
                child_run_id=body.child_run_id, failure=failure_from_proto(required_field(body, "failure", where))
            )
        case history_pb2.SideEffectExecuted():
            return ev.SideEffectExecuted(
                name=body.name, result=payload_from_proto(required_field(body, "result", where))
            )
        case history_pb2.PatchApplied():
            return ev.PatchApplied(patch_id=body.patch_id)
        case history_pb2.RunSuspended():
            return ev.RunSuspended()
        case history_pb2.RunResumed():
            return ev.RunResumed()
        case history_pb2.RunCancelled():
            return ev.RunCancelled(reason=body.reason)
        case history_pb2.RunCompleted():
            status = _STATUS_FROM_PROTO.get(body.status)
            if status is None:
                raise ValueError(f"{where}: RunCompleted has no valid status ({body.status})")
            return ev.RunCompleted(
                status=status,
                result=payload_from_proto(body.result) if body.HasField("result") else None,
                failure=failure_from_proto(body.failure) if body.HasField("failure") else None,
            )
        case history_pb2.RunTerminated():
            return ev.RunTerminated(reason=body.reason)
        case history_pb2.UpdateRequested():
            return ev.UpdateRequested(update_id=body.update_id, name=body.name, args=payloads_from_proto(body.args))
        case history_pb2.UpdateAccepted():
            return ev.UpdateAccepted(update_id=body.update_id, name=body.name, args=payloads_from_proto(body.args))
        case history_pb2.UpdateCompleted():
            return ev.UpdateCompleted(
                update_id=body.update_id,
                result=payload_from_proto(body.result) if body.HasField("result") else None,
                failure=failure_from_proto(body.failure) if body.HasField("failure") else None,
            )
        case history_pb2.ValuePublished():
            return ev.ValuePublished(key=body.key, value=payload_from_proto(required_field(body, "value", where)))
        case history_pb2.StreamItemWritten():
            return ev.StreamItemWritten(key=body.key, value=payload_from_proto(required_field(body, "value", where)))
        case history_pb2.StreamClosed():
            return ev.StreamClosed(key=body.key)
        case history_pb2.LabelsChanged():
            return ev.LabelsChanged(
                set=tuple((label.key, label.value) for label in body.set), removed=tuple(body.removed)
            )
        case history_pb2.CancelRequested():
            return ev.CancelRequested(created_seq=body.created_seq)
        case history_pb2.DetachedRunCreated():
            return ev.DetachedRunCreated(
                run_id=body.run_id,
                workflow_name=body.workflow_name,
                input=payloads_from_proto(body.input),
                queue=body.queue,
                instance_id=body.instance_id if body.HasField("instance_id") else None,
                priority=body.priority,
                concurrency_key=body.concurrency_key if body.HasField("concurrency_key") else None,
                labels=tuple((label.key, label.value) for label in body.labels),
                deadline=datetime_from_proto(body.deadline) if body.HasField("deadline") else None,
            )
    raise ValueError(f"{where}: unexpected message {body.DESCRIPTOR.full_name}")


def _optional_datetime(moment: datetime | None) -> Timestamp | None:
    return None if moment is None else datetime_to_proto(moment)


def _labels_to_proto(labels: ev.Labels) -> list[history_pb2.Label]:
    return [history_pb2.Label(key=key, value=value) for key, value in labels]
