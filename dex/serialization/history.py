"""The history codec: domain events to ``dex.v1`` protobuf messages and bytes, and back.

Adapters store and export histories through these functions; the domain never sees
protobuf. Every event kind maps to the message of the same name in ``history.proto``.
Datetimes are stored as ``Timestamp`` and come back timezone-aware in UTC; durations as
``Duration``; both round-trip exactly to the microsecond.

Bytes that cannot be read back raise ``ValueError`` naming what was being decoded, so a
storage adapter can fail the affected run with a clear message instead of crashing a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, assert_never, cast

import attrs
from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload
from dex.v1 import failure_pb2, history_pb2, payload_pb2, retry_pb2

_M = TypeVar("_M", bound=ProtoMessage)
_T = TypeVar("_T")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_STATUS_TO_PROTO: dict[RunStatus, history_pb2.RunStatus.ValueType] = {
    RunStatus.CREATED: history_pb2.RUN_STATUS_CREATED,
    RunStatus.RUNNING: history_pb2.RUN_STATUS_RUNNING,
    RunStatus.SUSPENDED: history_pb2.RUN_STATUS_SUSPENDED,
    RunStatus.COMPLETED: history_pb2.RUN_STATUS_COMPLETED,
    RunStatus.FAILED: history_pb2.RUN_STATUS_FAILED,
    RunStatus.CANCELLED: history_pb2.RUN_STATUS_CANCELLED,
}
_STATUS_FROM_PROTO = {number: status for status, number in _STATUS_TO_PROTO.items()}


@attrs.frozen(kw_only=True)
class ExportedHistory:
    """A decoded ``WorkflowHistory``: which run it belongs to, and its events."""

    run_id: str
    workflow_name: str
    events: tuple[ev.HistoryEvent, ...]


# --- events -------------------------------------------------------------------------------


def event_to_proto(event: ev.HistoryEvent) -> history_pb2.HistoryEvent:
    """The ``dex.v1.HistoryEvent`` message for a domain history event."""
    field, body = _body_to_proto(event.event)
    message = history_pb2.HistoryEvent(
        sequence_number=event.sequence_number, timestamp=datetime_to_proto(event.timestamp)
    )
    getattr(message, field).CopyFrom(body)  # also marks an empty event (RunStarted) as present
    return message


def event_from_proto(message: history_pb2.HistoryEvent) -> ev.HistoryEvent:
    """The domain history event in a ``dex.v1.HistoryEvent``; ``ValueError`` if incomplete."""
    where = f"history event #{message.sequence_number}"
    if not message.HasField("timestamp"):
        raise ValueError(f"{where} has no timestamp")
    field = message.WhichOneof("event")
    if field is None:
        raise ValueError(f"{where} holds no event (written by a newer dex?)")
    return ev.HistoryEvent(
        sequence_number=message.sequence_number,
        timestamp=datetime_from_proto(message.timestamp),
        event=_body_from_proto(getattr(message, field), where),
    )


def encode_event(event: ev.HistoryEvent) -> bytes:
    """Serialise one history event."""
    return event_to_proto(event).SerializeToString()


def decode_event(data: bytes) -> ev.HistoryEvent:
    """Read one history event written by :func:`encode_event`; ``ValueError`` if unreadable."""
    return _decoding("a history event", data, lambda: event_from_proto(_parse(history_pb2.HistoryEvent, data)))


def encode_message(message: ev.Message) -> bytes:
    """Serialise an inbox message (an event that another party sends to a run)."""
    if not isinstance(message, ev.MESSAGE_TYPES):
        raise TypeError(f"{type(message).__name__} is not an inbox message kind")
    field, body = _body_to_proto(message)
    envelope = history_pb2.InboxMessage()
    getattr(envelope, field).CopyFrom(body)
    return envelope.SerializeToString()


def decode_message(data: bytes) -> ev.Message:
    """Read an inbox message written by :func:`encode_message`; ``ValueError`` if unreadable."""

    def decode() -> ev.Message:
        message = _parse(history_pb2.InboxMessage, data)
        field = message.WhichOneof("event")
        if field is None:
            raise ValueError("the inbox message holds no event (written by a newer dex?)")
        event = _body_from_proto(getattr(message, field), "inbox message")
        if not isinstance(event, ev.MESSAGE_TYPES):  # InboxMessage's oneof only has message kinds
            raise ValueError(f"{type(event).__name__} is not an inbox message kind")  # noqa: TRY004 - bad bytes
        return cast(ev.Message, event)

    return _decoding("an inbox message", data, decode)


# --- whole histories ----------------------------------------------------------------------


def encode_history(run_id: str, workflow_name: str, events: Iterable[ev.HistoryEvent]) -> bytes:
    """Serialise a run's history as a ``dex.v1.WorkflowHistory`` (what ``export_history`` returns)."""
    history = history_pb2.WorkflowHistory(
        run_id=run_id,
        workflow_name=workflow_name,
        events=[event_to_proto(event) for event in events],
    )
    return history.SerializeToString()


def decode_exported_history(data: bytes) -> ExportedHistory:
    """Read a ``dex.v1.WorkflowHistory`` with its run id and workflow name."""

    def decode() -> ExportedHistory:
        history = _parse(history_pb2.WorkflowHistory, data)
        return ExportedHistory(
            run_id=history.run_id,
            workflow_name=history.workflow_name,
            events=tuple(event_from_proto(event) for event in history.events),
        )

    return _decoding("a workflow history", data, decode)


def decode_history(data: bytes) -> list[ev.HistoryEvent]:
    """Read the events of a ``dex.v1.WorkflowHistory``; ``ValueError`` if unreadable."""
    return list(decode_exported_history(data).events)


# --- values -------------------------------------------------------------------------------


def encode_payload(payload: Payload) -> bytes:
    """Serialise one payload as a ``dex.v1.Payload``."""
    return payload_to_proto(payload).SerializeToString()


def decode_payload(data: bytes) -> Payload:
    """Read a ``dex.v1.Payload``; ``ValueError`` if unreadable."""
    return _decoding("a payload", data, lambda: payload_from_proto(_parse(payload_pb2.Payload, data)))


def encode_payloads(payloads: Sequence[Payload]) -> bytes:
    """Serialise a sequence of payloads (e.g. call arguments) as a ``dex.v1.Payloads``."""
    return payload_pb2.Payloads(items=_payloads_to_proto(payloads)).SerializeToString()


def decode_payloads(data: bytes) -> tuple[Payload, ...]:
    """Read a ``dex.v1.Payloads``; ``ValueError`` if unreadable."""
    return _decoding("a payload list", data, lambda: _payloads_from_proto(_parse(payload_pb2.Payloads, data).items))


def encode_failure(failure: FailureInfo) -> bytes:
    """Serialise a failure (with its causes) as a ``dex.v1.FailureInfo``."""
    return failure_to_proto(failure).SerializeToString()


def decode_failure(data: bytes) -> FailureInfo:
    """Read a ``dex.v1.FailureInfo``; ``ValueError`` if unreadable."""
    return _decoding("a failure", data, lambda: failure_from_proto(_parse(failure_pb2.FailureInfo, data)))


def encode_retry_policy(policy: RetryPolicy) -> bytes:
    """Serialise a retry policy as a ``dex.v1.RetryPolicy``."""
    return retry_policy_to_proto(policy).SerializeToString()


def decode_retry_policy(data: bytes) -> RetryPolicy:
    """Read a ``dex.v1.RetryPolicy``; ``ValueError`` if unreadable or invalid."""
    return _decoding(
        "a retry policy", data, lambda: retry_policy_from_proto(_parse(retry_pb2.RetryPolicy, data))
    )


# --- value messages -----------------------------------------------------------------------


def datetime_to_proto(moment: datetime) -> timestamp_pb2.Timestamp:
    """An aware datetime as a ``Timestamp``; a naive one is refused (its instant is unknown)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment.isoformat()} cannot be stored: dex stores aware UTC times")
    # Integer arithmetic: going through float seconds would lose microseconds far from 1970.
    seconds, micros = divmod((moment - _EPOCH) // _MICROSECOND, 1_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=micros * 1000)


def datetime_from_proto(stamp: timestamp_pb2.Timestamp) -> datetime:
    """A ``Timestamp`` as an aware UTC datetime (sub-microsecond digits are dropped)."""
    return _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def timedelta_to_proto(delta: timedelta) -> duration_pb2.Duration:
    """A timedelta as a ``Duration`` (seconds and nanos carry the same sign, as proto asks)."""
    micros = delta // _MICROSECOND
    seconds, rest = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1
    return duration_pb2.Duration(seconds=sign * seconds, nanos=sign * rest * 1000)


def timedelta_from_proto(duration: duration_pb2.Duration) -> timedelta:
    """A ``Duration`` as a timedelta (sub-microsecond digits are dropped)."""
    return timedelta(seconds=duration.seconds, microseconds=int(duration.nanos / 1000))


def payload_to_proto(payload: Payload) -> payload_pb2.Payload:
    """A domain payload as a ``dex.v1.Payload``."""
    return payload_pb2.Payload(encoding=payload.encoding, data=payload.data, message_type=payload.message_type)


def payload_from_proto(message: payload_pb2.Payload) -> Payload:
    """A ``dex.v1.Payload`` as a domain payload."""
    return Payload(encoding=message.encoding, data=message.data, message_type=message.message_type)


def failure_to_proto(failure: FailureInfo) -> failure_pb2.FailureInfo:
    """A failure and its chain of causes as a ``dex.v1.FailureInfo``."""
    return failure_pb2.FailureInfo(
        type=failure.type,
        message=failure.message,
        stack_trace=failure.stack_trace,
        terminal=failure.terminal,
        cause=None if failure.cause is None else failure_to_proto(failure.cause),
    )


def failure_from_proto(message: failure_pb2.FailureInfo) -> FailureInfo:
    """A ``dex.v1.FailureInfo`` as a domain failure."""
    return FailureInfo(
        type=message.type,
        message=message.message,
        stack_trace=message.stack_trace,
        terminal=message.terminal,
        cause=failure_from_proto(message.cause) if message.HasField("cause") else None,
    )


def retry_policy_to_proto(policy: RetryPolicy) -> retry_pb2.RetryPolicy:
    """A retry policy as a ``dex.v1.RetryPolicy``."""
    return retry_pb2.RetryPolicy(
        initial_delay=timedelta_to_proto(policy.initial_delay),
        multiplier=policy.multiplier,
        randomization_factor=policy.randomization_factor,
        max_delay=timedelta_to_proto(policy.max_delay),
        max_attempts=policy.max_attempts,
    )


def retry_policy_from_proto(message: retry_pb2.RetryPolicy) -> RetryPolicy:
    """A ``dex.v1.RetryPolicy`` as a domain policy; ``ValueError`` if it is incomplete or invalid."""
    where = "retry policy"
    return RetryPolicy(
        initial_delay=timedelta_from_proto(_required(message, "initial_delay", where)),
        multiplier=message.multiplier,
        randomization_factor=message.randomization_factor,
        max_delay=timedelta_from_proto(_required(message, "max_delay", where)),
        max_attempts=message.max_attempts,
    )


def _payloads_to_proto(payloads: Iterable[Payload]) -> list[payload_pb2.Payload]:
    return [payload_to_proto(payload) for payload in payloads]


def _payloads_from_proto(messages: Iterable[payload_pb2.Payload]) -> tuple[Payload, ...]:
    return tuple(payload_from_proto(message) for message in messages)


def _required(message: ProtoMessage, field: str, where: str) -> Any:
    """A message-typed field that the domain requires; proto3 would silently default it."""
    if not message.HasField(field):
        raise ValueError(f"{where}: {message.DESCRIPTOR.name}.{field} is missing")
    return getattr(message, field)


# --- the per-kind mapping -----------------------------------------------------------------


def _body_to_proto(event: ev.Event) -> tuple[str, ProtoMessage]:
    """The oneof field name and message for an event; mypy checks that every kind is here."""
    match event:
        case ev.RunCreated():
            return "run_created", history_pb2.RunCreated(
                workflow_name=event.workflow_name,
                input=_payloads_to_proto(event.input),
                queue=event.queue,
                instance_id=event.instance_id,
                priority=event.priority,
                concurrency_key=event.concurrency_key,
                labels=_labels_to_proto(event.labels),
                parent_run_id=event.parent_run_id,
                generation=event.generation,
                random_seed=event.random_seed,
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
                input=_payloads_to_proto(event.input),
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
                input=_payloads_to_proto(event.input),
                queue=event.queue,
                instance_id=event.instance_id,
                priority=event.priority,
                concurrency_key=event.concurrency_key,
                labels=_labels_to_proto(event.labels),
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
        case _:
            assert_never(event)


def _body_from_proto(body: ProtoMessage, where: str) -> ev.Event:
    """The domain event for one of the per-kind messages; ``ValueError`` if a field is missing."""
    match body:
        case history_pb2.RunCreated():
            return ev.RunCreated(
                workflow_name=body.workflow_name,
                input=_payloads_from_proto(body.input),
                queue=body.queue,
                instance_id=body.instance_id if body.HasField("instance_id") else None,
                priority=body.priority,
                concurrency_key=body.concurrency_key if body.HasField("concurrency_key") else None,
                labels=tuple((label.key, label.value) for label in body.labels),
                parent_run_id=body.parent_run_id if body.HasField("parent_run_id") else None,
                generation=body.generation,
                random_seed=body.random_seed,
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
                input=_payloads_from_proto(body.input),
                queue=body.queue,
                priority=body.priority,
                retry_policy=retry_policy_from_proto(_required(body, "retry_policy", where)),
                lock_timeout=timedelta_from_proto(_required(body, "lock_timeout", where)),
            )
        case history_pb2.ActivityTaskCompleted():
            return ev.ActivityTaskCompleted(
                created_seq=body.created_seq, result=payload_from_proto(_required(body, "result", where))
            )
        case history_pb2.ActivityTaskFailed():
            return ev.ActivityTaskFailed(
                created_seq=body.created_seq, failure=failure_from_proto(_required(body, "failure", where))
            )
        case history_pb2.TimerCreated():
            return ev.TimerCreated(fire_at=datetime_from_proto(_required(body, "fire_at", where)))
        case history_pb2.TimerElapsed():
            return ev.TimerElapsed(created_seq=body.created_seq)
        case history_pb2.ExternalEventReceived():
            return ev.ExternalEventReceived(
                event_id=body.event_id, payload=payload_from_proto(_required(body, "payload", where))
            )
        case history_pb2.ChildRunCreated():
            return ev.ChildRunCreated(
                child_run_id=body.child_run_id,
                workflow_name=body.workflow_name,
                input=_payloads_from_proto(body.input),
                queue=body.queue,
                instance_id=body.instance_id if body.HasField("instance_id") else None,
                priority=body.priority,
                concurrency_key=body.concurrency_key if body.HasField("concurrency_key") else None,
                labels=tuple((label.key, label.value) for label in body.labels),
            )
        case history_pb2.ChildRunCompleted():
            return ev.ChildRunCompleted(
                child_run_id=body.child_run_id, result=payload_from_proto(_required(body, "result", where))
            )
        case history_pb2.ChildRunFailed():
            return ev.ChildRunFailed(
                child_run_id=body.child_run_id, failure=failure_from_proto(_required(body, "failure", where))
            )
        case history_pb2.SideEffectExecuted():
            return ev.SideEffectExecuted(name=body.name, result=payload_from_proto(_required(body, "result", where)))
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
    raise ValueError(f"{where}: unexpected message {body.DESCRIPTOR.full_name}")


def _labels_to_proto(labels: ev.Labels) -> list[history_pb2.Label]:
    return [history_pb2.Label(key=key, value=value) for key, value in labels]


# --- decoding guards ----------------------------------------------------------------------


def _parse(cls: type[_M], data: bytes) -> _M:
    message = cls()
    message.ParseFromString(data)
    return message


def _decoding(what: str, data: bytes, decode: Callable[[], _T]) -> _T:
    """Run ``decode``, turning every way bad bytes can fail into one ``ValueError`` naming ``what``."""
    try:
        return decode()
    except (DecodeError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise ValueError(f"cannot decode {what} from {len(data)} bytes: {exc}") from exc
