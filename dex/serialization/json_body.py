"""A request's JSON body, read the one way every HTTP route of dex reads it.

The JSON API (:mod:`dex.web.inputs`) and the remote workers' routes
(:mod:`dex.remote.http_routes`) both take a JSON object as a body; each answers a body that is
not one with a 400 ``BadRequest`` whose message this module writes, so a client that sends the
same bad bytes to two routes gets the same answer from both.

Strict JSON only (RFC 8259): UTF-8 text (a body in another encoding, or bytes that are not
UTF-8 at all, such as an encoded lone surrogate, is refused, where Python's ``json`` would
guess an encoding), no ``NaN`` or ``Infinity`` and no number too large for a float (which
JavaScript's ``JSON.parse`` refuses or reads as something else). An empty body is the empty
object (a call that takes no fields needs none). Escapes in strings (``\\u0000``, a lone
``\\ud800``) are JSON and are read: the field that holds one says whether it may (a name may
not, a workflow's argument may hold a NUL).
"""

from __future__ import annotations

import json
import math
from typing import Any


class MalformedBodyError(ValueError):
    """The body is not a JSON object; the message says why (for the 400 that answers it)."""


def json_object(data: bytes) -> dict[str, Any]:
    """``data`` read as a JSON object; :class:`MalformedBodyError` if it is not one."""
    if not data:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBodyError(
            f"the body is not JSON: it is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise MalformedBodyError("the body is not JSON dex reads: it is nested too deeply") from None
    except ValueError as exc:
        raise MalformedBodyError(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedBodyError(f"the body must be a JSON object, got {json_type(value)}")
    return value


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (array, not list)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON has not
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity
        raise ValueError(f"the number {text[:40]} is out of range")
    return value
