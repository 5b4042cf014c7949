"""Reading what a request says: query parameters, JSON bodies, form posts and paging cursors.

Every value is checked where it enters, as the engine's own calls check theirs (docs/reference/contract.md §8): a
NUL or a lone surrogate in a parameter is a 400 naming the parameter, never a query that
fails for everyone. A JSON body that is not JSON (or not an object) is a 400 too; values of
the right form that dex refuses (an unknown status, a label dex cannot store) are the
engine's to refuse, as a 422.

A body's size is bounded before it gets here, while it streams in (:mod:`dex.web.body_limit`).

The runs list pages by keyset, not by offset: a cursor names the last run shown by its
``created_at`` and how many runs with exactly that ``created_at`` were shown already (signed,
so that count is never a client's choice). The next
page asks ``list_runs`` for runs created at or before that instant (served by the index on
``(created_at, position)``), skips the ones already shown at that instant and returns the
rest. Runs created at one instant are few (a virtual clock in a test is the exception), so a
page reads at most its own size plus those.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import attrs

from dex.serialization import json_body
from dex.web.errors import bad_request
from dex.web.signing import Signer

MAX_PAGE = 500
# runs created at one instant that paging may step over: more than any real clock makes (a
# virtual clock in a test may make a few thousand), and a bound on what one page may read
MAX_CURSOR_OFFSET = 1_000_000
CURSOR = "runs cursor"  # the signing purpose of cursors
MAX_SEQ = 2**63 - 1  # the largest sequence number a history could reach (a bigint)


def checked(value: str, field: str) -> str:
    """``value`` if it holds no NUL and no lone surrogate; a 400 naming ``field`` otherwise."""
    if "\x00" in value:
        raise bad_request(f"{field} must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{field} must be valid text (it holds a lone surrogate)") from None
    return value


def one(params: Mapping[str, str], name: str) -> str | None:
    """An optional query parameter; empty counts as absent (a blank filter field in a form)."""
    value = params.get(name)
    if value is None or value == "":
        return None
    return checked(value, name)


def moment(params: Mapping[str, str], name: str) -> datetime | None:
    """An ISO 8601 time with a timezone (``Z`` or an offset)."""
    text = one(params, name)
    if text is None:
        return None
    try:
        # RFC 3339 allows a lower-case t and z too (the OpenAPI document's date-time)
        value = datetime.fromisoformat(text.upper().replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise bad_request(f"{name} must be an ISO 8601 time, got {text[:60]!r}") from None
    if value.tzinfo is None:
        raise bad_request(f"{name} must have a timezone (e.g. 2026-01-05T02:00:00Z), got {text[:60]!r}")
    return value


def integer(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = optional_integer(params, name, low, high)
    return default if value is None else value


def optional_integer(params: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    """An integer query parameter from ``low`` to ``high``, or None when it is absent."""
    text = one(params, name)
    if text is None:
        return None
    if len(text) > 40:  # int() of a long digit string is slow, and no bound needs one
        raise bad_request(f"{name} must be an integer between {low} and {high}, got {text[:60]!r}…")
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {text[:60]!r}") from None
    if not low <= value <= high:
        raise bad_request(f"{name} must be between {low} and {high}, got {value}")
    return value


def labels(values: list[str], field: str = "label") -> dict[str, str]:
    """``key=value`` filters (each query parameter ``label`` one pair)."""
    pairs: dict[str, str] = {}
    for text in values:
        if text == "":
            continue
        key, sep, value = checked(text, field).partition("=")
        if not sep or not key:
            raise bad_request(f"{field} must be KEY=VALUE, got {text[:60]!r}")
        pairs[key] = value
    return pairs


async def json_object(request: Any) -> dict[str, Any]:
    """The request's JSON body, an object ({} when the body is empty); a 400 ``BadRequest``
    otherwise, worded as the remote workers' routes word it (:mod:`dex.serialization.json_body`)."""
    try:
        return json_body.json_object(await _body(request))
    except json_body.MalformedBodyError as exc:
        raise bad_request(str(exc)) from None


async def form(request: Any) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the pages' forms), its values checked."""
    body = await _body(request)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("the form is not UTF-8") from None
    fields: dict[str, str] = {}
    try:
        pairs = parse_qsl(text, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise bad_request("the form holds an escape that is not UTF-8") from None
    for key, value in pairs:
        fields[checked(key, "form field")] = checked(value, key)
    return fields


async def _body(request: Any) -> bytes:
    # bounded while it streams in, before any handler holds it (dex.web.body_limit)
    body: bytes = await request.body()
    return body


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """A field of a JSON body, of the given JSON type, or ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # 49.0 is an integer, as JSON Schema (and the OpenAPI document) counts it
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise bad_request(f"{name} must be a JSON {names}, got {type(value).__name__}")
    return value


def whole_number(body: Mapping[str, Any], name: str, low: int, high: int, default: int | None = None) -> int | None:
    """An integer field of a JSON body from ``low`` to ``high`` (``default`` when absent or null);
    a 400 naming the field and the range otherwise, before any store sees a number its column
    cannot hold. ``49.0`` counts as 49, as JSON Schema counts it."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer from {low} to {high}, got {type(value).__name__}")
    if not low <= value <= high:
        raise bad_request(f"{name} must be an integer from {low} to {high}, got {str(value)[:40]}")
    return value


def form_number(fields: Mapping[str, str], name: str, low: int, high: int) -> int:
    """An integer typed into a form, from ``low`` to ``high``; a 400 naming it otherwise."""
    text = fields.get(name, "").strip()
    if not text or len(text) > 40 or not text.lstrip("+-").isdigit():
        raise bad_request(f"{name} must be a whole number from {low} to {high}, got {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}, got {value}")
    return value


@attrs.frozen(kw_only=True)
class Cursor:
    """Where a page of runs ends: the last run's ``created_at`` and how many runs created at
    exactly that instant the pages so far have shown.

    Given out signed (:mod:`dex.web.signing`): a cursor whose signature does not match is a 400
    before it is read, so the count is one the API counted, never a number a client chose to
    make the next page read a whole table. Read strictly all the same: the count is an integer
    from 0 to ``MAX_CURSOR_OFFSET`` and the instant one whose next microsecond exists.
    """

    created_at: datetime
    shown_at_instant: int

    def encode(self, signer: Signer) -> str:
        text = json.dumps({"t": self.created_at.isoformat(), "o": self.shown_at_instant})
        payload = base64.urlsafe_b64encode(text.encode()).decode("ascii").rstrip("=")
        return f"{payload}.{signer.signature(CURSOR, payload)}"

    @classmethod
    def decode(cls, text: str, signer: Signer) -> Cursor:
        refused = bad_request("cursor is not one this API gave out (pass next_cursor of the previous page as is)")
        payload, _, signature = text.partition(".")
        if len(text) > 400 or not signer.verify(CURSOR, payload, signature):
            raise refused
        try:
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            created_at = datetime.fromisoformat(data["t"])
            shown = data["o"]
        except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise refused from None
        if type(shown) is not int or not 0 <= shown <= MAX_CURSOR_OFFSET or created_at.tzinfo is None:
            raise refused
        cursor = cls(created_at=created_at, shown_at_instant=shown)
        try:
            cursor.bound()
        except OverflowError:  # the last instant a datetime holds: nothing can follow it
            raise refused from None
        return cursor

    def bound(self) -> datetime:
        """``created_before`` for the next page: the cursor's instant included."""
        return self.created_at + timedelta(microseconds=1)
