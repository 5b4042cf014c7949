"""Codec for the values inside events: payloads, failures, retry policies, times and durations.

Each value maps to its ``dex.v1`` message and to bytes; decoding bad bytes raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from dex.domain.retry import RetryPolicy
from dex.domain.values import FailureInfo, Payload
from dex.v1 import failure_pb2, payload_pb2, retry_pb2

_M = TypeVar("_M", bound=ProtoMessage)
_T = TypeVar("_T")
_K = TypeVar("_K")
_V = TypeVar("_V")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_payload(payload: Payload) -> bytes:
    """Serialise one payload as a ``dex.v1.Payload``."""
    return payload_to_proto(payload).SerializeToString()


def decode_payload(data: bytes) -> Payload:
    """Read a ``dex.v1.Payload``; ``ValueError`` if unreadable."""
    return decoding("a payload", data, lambda: payload_from_proto(parse_message(payload_pb2.Payload, data)))


def encode_payloads(payloads: Sequence[Payload]) -> bytes:
    """Serialise a sequence of payloads (e.g. call arguments) as a ``dex.v1.Payloads``."""
    return payload_pb2.Payloads(items=payloads_to_proto(payloads)).SerializeToString()


def decode_payloads(data: bytes) -> tuple[Payload, ...]:
    """Read a ``dex.v1.Payloads``; ``ValueError`` if unreadable."""
    return decoding(
        "a payload list", data, lambda: payloads_from_proto(parse_message(payload_pb2.Payloads, data).items)
    )


def encode_failure(failure: FailureInfo) -> bytes:
    """Serialise a failure (with its causes) as a ``dex.v1.FailureInfo``."""
    return failure_to_proto(failure).SerializeToString()


def decode_failure(data: bytes) -> FailureInfo:
    """Read a ``dex.v1.FailureInfo``; ``ValueError`` if unreadable."""
    return decoding("a failure", data, lambda: failure_from_proto(parse_message(failure_pb2.FailureInfo, data)))


# An activity's retry policy is the same for every call of it, and each activity task carries
# it: written with each task a flush inserts and read with each task a claim returns. So both
# directions keep the few distinct policies they met (a bounded map, emptied when full).
_POLICY_CACHE_SIZE = 256
# A policy's key holds its numbers' types too: 6 and 6.0 are equal, but only one is an int32.
_encoded_policies: dict[tuple[object, ...], bytes] = {}
_decoded_policies: dict[bytes, RetryPolicy] = {}


def encode_retry_policy(policy: RetryPolicy) -> bytes:
    """Serialise a retry policy as a ``dex.v1.RetryPolicy``."""
    key = (policy, type(policy.multiplier), type(policy.randomization_factor), type(policy.max_attempts))
    data = _encoded_policies.get(key)
    if data is None:
        data = retry_policy_to_proto(policy).SerializeToString()
        _remember(_encoded_policies, key, data)
    return data


def decode_retry_policy(data: bytes) -> RetryPolicy:
    """Read a ``dex.v1.RetryPolicy``; ``ValueError`` if unreadable or invalid."""
    policy = _decoded_policies.get(data)
    if policy is None:
        policy = decoding(
            "a retry policy", data, lambda: retry_policy_from_proto(parse_message(retry_pb2.RetryPolicy, data))
        )
        _remember(_decoded_policies, bytes(data), policy)
    return policy


def _remember(cache: dict[_K, _V], key: _K, value: _V) -> None:
    if len(cache) >= _POLICY_CACHE_SIZE:
        cache.clear()
    cache[key] = value


# --- value messages -----------------------------------------------------------------------


def datetime_to_proto(moment: datetime) -> timestamp_pb2.Timestamp:
    """An aware datetime as a ``Timestamp``; a naive one is refused (its instant is unknown)."""
    seconds, nanos = timestamp_fields(moment)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def timestamp_fields(moment: datetime) -> tuple[int, int]:
    """The ``seconds`` and ``nanos`` of the ``Timestamp`` of an aware datetime (see above)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment.isoformat()} cannot be stored: dex stores aware UTC times")
    # Integer arithmetic: going through float seconds would lose microseconds far from 1970.
    seconds, micros = divmod((moment - _EPOCH) // _MICROSECOND, 1_000_000)
    return seconds, micros * 1000


def datetime_from_proto(stamp: timestamp_pb2.Timestamp) -> datetime:
    """A ``Timestamp`` as an aware UTC datetime (sub-microsecond digits are dropped)."""
    return datetime_from_fields(stamp.seconds, stamp.nanos)


def datetime_from_fields(seconds: int, nanos: int) -> datetime:
    """:func:`datetime_from_proto` of a ``Timestamp``'s two fields."""
    return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


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
        initial_delay=timedelta_from_proto(required_field(message, "initial_delay", where)),
        multiplier=message.multiplier,
        randomization_factor=message.randomization_factor,
        max_delay=timedelta_from_proto(required_field(message, "max_delay", where)),
        max_attempts=message.max_attempts,
    )


def payloads_to_proto(payloads: Iterable[Payload]) -> list[payload_pb2.Payload]:
    return [payload_to_proto(payload) for payload in payloads]


def payloads_from_proto(messages: Iterable[payload_pb2.Payload]) -> tuple[Payload, ...]:
    return tuple(payload_from_proto(message) for message in messages)


def required_field(message: ProtoMessage, field: str, where: str) -> Any:
    """A message-typed field that the domain requires; proto3 would silently default it."""
    if not message.HasField(field):
        raise ValueError(f"{where}: {message.DESCRIPTOR.name}.{field} is missing")
    return getattr(message, field)


# --- the per-kind mapping -----------------------------------------------------------------


def parse_message(cls: type[_M], data: bytes) -> _M:
    message = cls()
    message.ParseFromString(data)
    return message


def decoding(what: str, data: bytes, decode: Callable[[], _T]) -> _T:
    """Run ``decode``, turning every way bad bytes can fail into one ``ValueError`` naming ``what``."""
    try:
        return decode()
    except (DecodeError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise ValueError(f"cannot decode {what} from {len(data)} bytes: {exc}") from exc
