"""The bytes of the history events every workflow step writes, put together without building
a protobuf message for each one.

A three-activity workflow writes sixteen history events in its one task. Building each as a
``dex.v1.HistoryEvent`` (an envelope, a ``Timestamp``, the body, a ``Payload`` or a
``RetryPolicy`` with three ``Duration``s) and serialising it cost ~8-27 µs per event, most of
it in Python-side message construction. Yet most of those bytes repeat: all events of a task
share one timestamp, the bodies of ``WorkflowTaskStarted``, ``WorkflowTaskCompleted`` and
``RunStarted`` are empty, and an activity's queue, priority, retry policy and lock timeout are
the same for every call of it. So the kinds on that path are written here field by field in
the protobuf wire format, with the repeating parts cached; every other kind (and any value
these functions do not handle) goes through the generated classes.

The result is byte for byte what ``event_to_proto(event).SerializeToString()`` gives
(fields in field-number order, proto3 defaults left out), which
``tests/unit/test_history_codec.py`` checks for every event kind with random values.
"""

from __future__ import annotations

import functools
from datetime import datetime

from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.values import Payload
from dex.serialization.values import retry_policy_to_proto, timedelta_to_proto, timestamp_fields
from dex.v1 import history_pb2

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# HistoryEvent's field numbers (history.proto): 1 sequence_number, 2 timestamp, oneof from 10
_SEQUENCE_TAG = b"\x08"  # field 1, varint
_TIMESTAMP_TAG = b"\x12"  # field 2, length-delimited
_RUN_STARTED = b"\x5a\x00"  # field 11, an empty message
_WORKFLOW_TASK_STARTED = b"\x62\x00"  # field 12
_WORKFLOW_TASK_COMPLETED = b"\x6a\x00"  # field 13
_ACTIVITY_TASK_CREATED_TAG = b"\x72"  # field 14
_ACTIVITY_TASK_COMPLETED_TAG = b"\x7a"  # field 15
_RUN_CREATED_TAG = b"\x52"  # field 10
_RUN_COMPLETED_TAG = b"\xda\x01"  # field 27
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UINT64_MAX = 2**64 - 1


class Unhandled(Exception):  # a signal, not an error: the caller takes the general path
    """A value this module does not write itself."""


# the varints of 0-127, one byte each: sequence numbers, lengths and small counts mostly are
_SMALL = tuple(bytes((value,)) for value in range(0x80))
# field 1 (the sequence number) with each of those values: the head of most events
_SEQUENCE_HEADS = tuple(b"\x08" + small for small in _SMALL)


def varint(value: int) -> bytes:
    """A protobuf varint; negative numbers as their 64-bit two's complement (int32 and int64)."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(tag: bytes, data: bytes) -> bytes:
    size = len(data)
    return tag + (_SMALL[size] if size < 0x80 else varint(size)) + data


def repeated_message_field(message: bytes) -> bytes:
    """One element of field 1 holding ``message``'s bytes: a ``HistoryBlock``'s events."""
    return _length_delimited(b"\x0a", message)


def _int64(value: int) -> int:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise Unhandled  # the generated classes raise their own "out of range" error
    return value


@functools.lru_cache(maxsize=64)
def _timestamp_field(moment: datetime) -> bytes:
    """Field 2 of the envelope (a ``Timestamp``: 1 seconds, 2 nanos); cached, as the events of
    one step share its timestamp. A naive datetime is refused by ``timestamp_fields``."""
    seconds, nanos = timestamp_fields(moment)
    body = (b"\x08" + varint(seconds) if seconds else b"") + (b"\x10" + varint(nanos) if nanos else b"")
    return _length_delimited(_TIMESTAMP_TAG, body)


def _string(tag: bytes, text: str) -> bytes:
    return _length_delimited(tag, text.encode("utf-8")) if text else b""


# field 1 of a Payload for the encodings dex writes (one lookup, not an encode, per payload)
_ENCODING_FIELDS: dict[str, bytes] = {}


def payload_bytes(payload: Payload) -> bytes:
    """A ``dex.v1.Payload`` message (without its own tag)."""
    data, name = payload.data, payload.encoding
    plain = type(name) is str  # a subclass's own __hash__ is not asked (it may raise)
    encoding = _ENCODING_FIELDS.get(name) if plain else None
    if encoding is None:
        encoding = _string(b"\x0a", name)
        if plain and len(_ENCODING_FIELDS) < 16:  # dex's few encodings; others are written each time
            _ENCODING_FIELDS[name] = encoding
    if data:
        size = len(data)
        encoding += b"\x12" + (_SMALL[size] if size < 0x80 else varint(size)) + data
    return encoding + _string(b"\x1a", payload.message_type) if payload.message_type else encoding


def _name_and_input(name: str, items: tuple[Payload, ...]) -> bytes:
    """Fields 1 (a name) and 2 (repeated payloads), as ``ActivityTaskCreated`` and ``RunCreated`` begin."""
    return _string(b"\x0a", name) + b"".join(_length_delimited(b"\x12", payload_bytes(item)) for item in items)


def _activity_task_created(event: ev.ActivityTaskCreated, tail: bytes) -> bytes:
    return _length_delimited(_ACTIVITY_TASK_CREATED_TAG, _name_and_input(event.name, event.input) + tail)


def _activity_task_created_tail(event: ev.ActivityTaskCreated) -> bytes:
    """Fields 3-6 of an ``ActivityTaskCreated`` (name and input left empty, so left out)."""
    return history_pb2.ActivityTaskCreated(
        queue=event.queue,
        priority=event.priority,
        retry_policy=retry_policy_to_proto(event.retry_policy),
        lock_timeout=timedelta_to_proto(event.lock_timeout),
    ).SerializeToString()


def _activity_task_completed(event: ev.ActivityTaskCompleted) -> bytes:
    created_seq = event.created_seq
    if 0 < created_seq < 0x80:
        head = _SEQUENCE_HEADS[created_seq]  # field 1 here too
    else:
        head = b"\x08" + varint(_int64(created_seq)) if created_seq else b""
    body = head + _length_delimited(b"\x12", payload_bytes(event.result))  # a message field: always present
    return _length_delimited(_ACTIVITY_TASK_COMPLETED_TAG, body)


def _optional_string(tag: bytes, text: str | None) -> bytes:
    return b"" if text is None else _length_delimited(tag, text.encode("utf-8"))


def _labels(tag: bytes, labels: ev.Labels) -> bytes:
    return b"".join(_length_delimited(tag, _string(b"\x0a", key) + _string(b"\x12", value)) for key, value in labels)


def _run_created(event: ev.RunCreated) -> bytes:
    if not _INT32_MIN <= event.priority <= _INT32_MAX or not 0 <= event.random_seed <= _UINT64_MAX:
        raise Unhandled  # the generated classes raise their own "out of range" error
    if event.deadline is not None or event.closed_streams:
        # rare (a run with a timeout, a generation after a stream's close): the generated classes write them
        raise Unhandled
    body = _name_and_input(event.workflow_name, event.input) + (
        _string(b"\x1a", event.queue)
        + _optional_string(b"\x22", event.instance_id)
        + (b"\x28" + varint(event.priority) if event.priority else b"")
        + _optional_string(b"\x32", event.concurrency_key)
        + _labels(b"\x3a", event.labels)
        + _optional_string(b"\x42", event.parent_run_id)
        + (b"\x48" + varint(_int64(event.generation)) if event.generation else b"")
        + (b"\x50" + varint(event.random_seed) if event.random_seed else b"")
        + _labels(b"\x5a", event.trace_context)
        + _optional_string(b"\x62", event.code_version)
    )
    return _length_delimited(_RUN_CREATED_TAG, body)


def _run_completed(event: ev.RunCompleted) -> bytes:
    """A run that completed with a result; other outcomes (a failure) go the general way."""
    if event.status is not RunStatus.COMPLETED or event.failure is not None:
        raise Unhandled
    body = b"\x08" + varint(history_pb2.RUN_STATUS_COMPLETED)
    if event.result is not None:
        body += _length_delimited(b"\x12", payload_bytes(event.result))
    return _length_delimited(_RUN_COMPLETED_TAG, body)


class EventWriter:
    """Writes the envelope and the common kinds' bodies, with the tail of each distinct
    ``ActivityTaskCreated`` (queue, priority, retry policy, lock timeout) built once by the
    generated classes and then cached (``cache_size`` tails at most)."""

    def __init__(self, cache_size: int = 1024) -> None:
        self._tails: dict[tuple[object, ...], bytes] = {}
        self._cache_size = cache_size

    def _tail(self, event: ev.ActivityTaskCreated) -> bytes:
        key = (event.queue, event.priority, event.retry_policy, event.lock_timeout)
        tail = self._tails.get(key)
        if tail is None:
            tail = _activity_task_created_tail(event)
            if len(self._tails) >= self._cache_size:
                self._tails.clear()
            self._tails[key] = tail
        return tail

    def write(self, event: ev.HistoryEvent) -> bytes:
        """The event's bytes; raises :class:`Unhandled` for a kind or value left to the caller."""
        body = event.event
        kind = type(body)  # exact types, commonest first (a subclass takes the general path)
        tail = _EMPTY_BODIES.get(kind)
        if tail is not None:
            pass
        elif kind is ev.ActivityTaskCompleted:
            tail = _activity_task_completed(body)  # type: ignore[arg-type]
        elif kind is ev.ActivityTaskCreated:
            tail = _activity_task_created(body, self._tail(body))  # type: ignore[arg-type]
        elif kind is ev.RunCreated:
            tail = _run_created(body)  # type: ignore[arg-type]
        elif kind is ev.RunCompleted:
            tail = _run_completed(body)  # type: ignore[arg-type]
        else:
            raise Unhandled
        seq = event.sequence_number
        if 0 < seq < 0x80:
            head = _SEQUENCE_HEADS[seq]
        else:
            seq = _int64(seq)
            head = _SEQUENCE_TAG + varint(seq) if seq else b""
        return head + _timestamp_field(event.timestamp) + tail


# the bodies that are empty messages: their bytes (tag and zero length) are all there is
_EMPTY_BODIES: dict[type, bytes] = {
    ev.WorkflowTaskStarted: _WORKFLOW_TASK_STARTED,
    ev.WorkflowTaskCompleted: _WORKFLOW_TASK_COMPLETED,
    ev.RunStarted: _RUN_STARTED,
}
