"""The history codec: domain events to ``dex.v1`` protobuf messages and bytes, and back.

Adapters store and export histories through these functions; the domain never sees
protobuf. Every event kind maps to the message of the same name in ``history.proto``
(``dex.serialization.bodies``).
Datetimes are stored as ``Timestamp`` and come back timezone-aware in UTC; durations as
``Duration``; both round-trip exactly to the microsecond.

Bytes that cannot be read back raise ``ValueError`` naming what was being decoded, so a
storage adapter can fail the affected run with a clear message instead of crashing a worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Iterable
from datetime import datetime
from typing import cast

import attrs

from dex.domain import events as ev
from dex.serialization import wire
from dex.serialization.bodies import body_from_proto, body_to_proto
from dex.serialization.values import (
    datetime_from_fields,
    datetime_from_proto,
    datetime_to_proto,
    decode_failure,
    decode_payload,
    decode_payloads,
    decode_retry_policy,
    decoding,
    encode_failure,
    encode_payload,
    encode_payloads,
    encode_retry_policy,
    parse_message,
)
from dex.v1 import history_pb2

__all__ = [
    "EncodedEvents",
    "ExportedHistory",
    "datetime_from_proto",
    "decode_block",
    "decode_block_from",
    "decode_event",
    "decode_exported_history",
    "decode_failure",
    "decode_history",
    "decode_message",
    "decode_payload",
    "decode_payloads",
    "decode_retry_policy",
    "encode_ahead",
    "encode_block",
    "encode_event",
    "encode_failure",
    "encode_history",
    "encode_message",
    "encode_payload",
    "encode_payloads",
    "encode_retry_policy",
    "event_from_proto",
    "event_to_proto",
]


@attrs.frozen(kw_only=True)
class ExportedHistory:
    """A decoded ``WorkflowHistory``: which run it belongs to, and its events."""

    run_id: str
    workflow_name: str
    events: tuple[ev.HistoryEvent, ...]


# --- events -------------------------------------------------------------------------------


def event_to_proto(event: ev.HistoryEvent) -> history_pb2.HistoryEvent:
    """The ``dex.v1.HistoryEvent`` message for a domain history event."""
    field, body = body_to_proto(event.event)
    message = history_pb2.HistoryEvent(
        sequence_number=event.sequence_number, timestamp=datetime_to_proto(event.timestamp)
    )
    getattr(message, field).CopyFrom(body)  # also marks an empty event (RunStarted) as present
    return message


def event_from_proto(message: history_pb2.HistoryEvent) -> ev.HistoryEvent:
    """The domain history event in a ``dex.v1.HistoryEvent``; ``ValueError`` if incomplete."""
    seq = message.sequence_number
    if not message.HasField("timestamp"):
        raise ValueError(f"history event #{seq} has no timestamp")
    field = message.WhichOneof("event")
    if field is None:
        raise ValueError(f"history event #{seq} holds no event (written by a newer dex?)")
    empty = _EMPTY_KINDS.get(field)
    stamp = message.timestamp
    return ev.HistoryEvent(
        sequence_number=seq,
        timestamp=_moment(stamp.seconds, stamp.nanos),
        event=empty() if empty is not None else body_from_proto(getattr(message, field), f"history event #{seq}"),
    )


# the kinds whose message is empty: their event is made without reading it (a third of the
# events of a workflow's history: each task's start and end)
_EMPTY_KINDS: dict[str, Callable[[], ev.Event]] = {
    "workflow_task_started": ev.WorkflowTaskStarted,
    "workflow_task_completed": ev.WorkflowTaskCompleted,
    "run_started": ev.RunStarted,
}


@functools.lru_cache(maxsize=256)
def _moment(seconds: int, nanos: int) -> datetime:
    """:func:`datetime_from_proto` of a timestamp's fields, kept: the events a task wrote share one."""
    return datetime_from_fields(seconds, nanos)


def encode_event(event: ev.HistoryEvent) -> bytes:
    """Serialise one history event: the bytes of ``event_to_proto(event).SerializeToString()``,
    written directly for the kinds every workflow step writes (:mod:`dex.serialization.wire`)."""
    try:
        return _WRITER.write(event)
    except (wire.Unhandled, UnicodeEncodeError):
        return event_to_proto(event).SerializeToString()


_WRITER = wire.EventWriter()


def decode_event(data: bytes) -> ev.HistoryEvent:
    """Read one history event written by :func:`encode_event`; ``ValueError`` if unreadable."""
    return decoding("a history event", data, lambda: event_from_proto(parse_message(history_pb2.HistoryEvent, data)))


def encode_block(events: Iterable[ev.HistoryEvent]) -> bytes:
    """Serialise consecutive events of one run as a ``dex.v1.HistoryBlock``: each event's
    :func:`encode_event` bytes as one element of its repeated field 1 (so a block costs the
    events' own encodings and a few framing bytes). Events that :func:`encode_ahead` made
    carry their block, which is returned as it is."""
    if type(events) is EncodedEvents:
        return events.block
    return _block_bytes(events)


def _block_bytes(events: Iterable[ev.HistoryEvent]) -> bytes:
    return b"".join([wire.repeated_message_field(encode_event(event)) for event in events])


class EncodedEvents(tuple[ev.HistoryEvent, ...]):
    """A tuple of events that carries its history block, encoded before it is written.

    The workflow worker encodes a task's events right after deciding it, in its loop, which
    lets an application's call go first between tasks; the flusher, which writes a whole
    round of results at once and never steps aside, then finds the bytes on the events it
    writes. The block travels with the value, so no cache has to match it to its events."""

    block: bytes


def encode_ahead(events: tuple[ev.HistoryEvent, ...]) -> tuple[ev.HistoryEvent, ...]:
    """``events`` with their block encoded now, for :func:`encode_block` to come."""
    encoded = EncodedEvents(events)
    encoded.block = _block_bytes(events)
    return encoded


def decode_block(data: bytes) -> list[ev.HistoryEvent]:
    """Read a block written by :func:`encode_block`; ``ValueError`` if unreadable."""
    return decoding(
        "a history block",
        data,
        lambda: [event_from_proto(event) for event in parse_message(history_pb2.HistoryBlock, data).events],
    )


def decode_block_from(data: bytes, last_seq: int, first_wanted: int) -> list[ev.HistoryEvent]:
    """The events numbered ``first_wanted`` or later of a block whose last event is numbered
    ``last_seq``; ``ValueError`` if unreadable.

    A block's events are numbered consecutively, so the wanted ones are its last few: only
    those become domain events (the C parser reads the rest without Python objects). A run's
    tail load asks for the end of the block its cached executor stands at, which may hold
    thousands of events; turning every one into a domain event made a long chain's tasks cost
    more the longer the chain. Should the numbering not match, the whole block is decoded and
    filtered, as if this shortcut did not exist."""

    def decode() -> list[ev.HistoryEvent]:
        events = parse_message(history_pb2.HistoryBlock, data).events
        skip = len(events) - (last_seq - first_wanted + 1)
        if 0 < skip < len(events):
            tail = [event_from_proto(event) for event in events[skip:]]
            if tail[0].sequence_number == first_wanted and tail[-1].sequence_number == last_seq:
                return tail
        return [e for e in (event_from_proto(event) for event in events) if e.sequence_number >= first_wanted]

    return decoding("a history block", data, decode)


_ENDINGS = ("activity_task_completed", "activity_task_failed")


def step_endings_in_block(
    data: bytes, created_seqs: Container[int], after_seq: int, limit: int
) -> tuple[list[ev.HistoryEvent], int]:
    """The outcomes of the activity steps scheduled at ``created_seqs`` among a block's first
    ``limit`` events numbered above ``after_seq``, and how many events it looked at (at most
    ``limit``); ``ValueError`` if unreadable. Only those outcomes become domain events (a step's page reads
    thousands of events after it to find where its steps ended, and needs a few of them)."""

    def decode() -> tuple[list[ev.HistoryEvent], int]:
        found, counted = [], 0
        for event in parse_message(history_pb2.HistoryBlock, data).events:
            if event.sequence_number <= after_seq:
                continue
            if counted == limit:
                break
            counted += 1
            field = event.WhichOneof("event")
            if field in _ENDINGS and getattr(event, field).created_seq in created_seqs:
                found.append(event_from_proto(event))
        return found, counted

    return decoding("a history block", data, decode)


def encode_message(message: ev.Message) -> bytes:
    """Serialise an inbox message (an event that another party sends to a run)."""
    if isinstance(message, ev.RunStarted):  # every start sends it, and it has no fields
        return _RUN_STARTED_MESSAGE
    if not isinstance(message, ev.MESSAGE_TYPES):
        raise TypeError(f"{type(message).__name__} is not an inbox message kind")
    field, body = body_to_proto(message)
    envelope = history_pb2.InboxMessage()
    getattr(envelope, field).CopyFrom(body)
    return envelope.SerializeToString()


_RUN_STARTED_MESSAGE = history_pb2.InboxMessage(run_started=history_pb2.RunStarted()).SerializeToString()


def decode_message(data: bytes) -> ev.Message:
    """Read an inbox message written by :func:`encode_message`; ``ValueError`` if unreadable."""

    def decode() -> ev.Message:
        message = parse_message(history_pb2.InboxMessage, data)
        field = message.WhichOneof("event")
        if field is None:
            raise ValueError("the inbox message holds no event (written by a newer dex?)")
        event = body_from_proto(getattr(message, field), "inbox message")
        if not isinstance(event, ev.MESSAGE_TYPES):  # InboxMessage's oneof only has message kinds
            raise ValueError(f"{type(event).__name__} is not an inbox message kind")
        return cast(ev.Message, event)

    return decoding("an inbox message", data, decode)


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
        history = parse_message(history_pb2.WorkflowHistory, data)
        return ExportedHistory(
            run_id=history.run_id,
            workflow_name=history.workflow_name,
            events=tuple(event_from_proto(event) for event in history.events),
        )

    return decoding("a workflow history", data, decode)


def decode_history(data: bytes) -> list[ev.HistoryEvent]:
    """Read the events of a ``dex.v1.WorkflowHistory``; ``ValueError`` if unreadable."""
    return list(decode_exported_history(data).events)
