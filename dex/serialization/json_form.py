"""A payload's JSON form: how arguments and results cross to workers in other languages (docs/reference/contract.md §13).

A ``json/plain`` payload *is* JSON text, so its JSON form is that text parsed, and a JSON value
from a remote worker becomes a ``json/plain`` payload again. A payload in another encoding
(``binary/plain`` bytes, ``binary/protobuf``) has no JSON form, and neither has a ``json/plain``
payload whose text is not strict JSON (``NaN`` and ``Infinity``, which Python's ``json`` writes
and JavaScript's ``JSON.parse`` refuses): :class:`NoJsonFormError` says so, for that value only.

Both directions are written once, here; the HTTP routes and the gRPC server use them through
:class:`dex.remote.service.ActivityTaskService`.
"""

from __future__ import annotations

import json
from typing import Any

from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.serialization.payloads import DEFAULT_MAX_PAYLOAD_SIZE, JSON_PLAIN, nesting_problem


class NoJsonFormError(SerializationError):
    """A payload that cannot cross as JSON (its encoding, or text that is not strict JSON)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_value(payload: Payload) -> Any:
    """The JSON value a payload holds; :class:`NoJsonFormError` if it holds none."""
    if payload.encoding != JSON_PLAIN:
        kind = f" ({payload.message_type})" if payload.message_type else ""
        raise NoJsonFormError(f"a {payload.encoding}{kind} payload has no JSON form; send JSON-compatible values")
    try:
        return json.loads(payload.data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NoJsonFormError(f"the payload's text is not strict JSON: {_reason(exc)}") from None


def json_values(payloads: tuple[Payload, ...]) -> list[Any]:
    """:func:`json_value` of each payload (an activity's arguments)."""
    return [json_value(payload) for payload in payloads]


def payload_of_json(value: Any, *, max_size: int = DEFAULT_MAX_PAYLOAD_SIZE) -> Payload:
    """A ``json/plain`` payload holding ``value``, a JSON value as a JSON parser gives it (None,
    bool, int, float, str, list, dict with str keys). :class:`SerializationError` for anything
    else: NaN or an infinity, a string that is not valid Unicode (a lone surrogate), a value
    nested more than ``MAX_NESTING`` levels deep (the limit of every payload, so that a value a
    remote worker returns can be sent on by the workflow), or text longer than ``max_size`` bytes."""
    problem = nesting_problem(value)
    if problem is not None:
        raise SerializationError(f"the value is not a payload: {problem}")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SerializationError(f"the value holds a string that is not valid Unicode ({exc.reason})") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"the value is not JSON: {_reason(exc)}") from None
    if len(data) > max_size:
        raise SerializationError(f"payload of {len(data)} bytes exceeds the limit of {max_size} bytes")
    return Payload(encoding=JSON_PLAIN, data=data)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    try:
        return str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
    except Exception:  # noqa: BLE001 - a reason that cannot be printed: the type says enough
        return type(exc).__name__
