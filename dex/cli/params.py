"""Parameter types of the command line, checked before anything touches the database.

A value that is wrong on its face (a label without ``=``, a date that is no date, a queue name
dex would refuse, a payload that is not JSON) is a usage error: exit code 2, and nothing was
sent. Only what the database decides (no such run, an illegal transition) is exit code 1.

A DSN must be one libpq can read, and a DSN or a token that is refused is never shown whole:
the DSN with its password redacted, the token not at all.

Every string the command line takes is text PostgreSQL can store: a NUL character, or a lone
surrogate (what Python makes of bytes on the command line that are not UTF-8), is refused
here. Numbers are bounded by the database's columns, times by what Python's datetime holds,
and a JSON payload must be strict JSON (no NaN or Infinity, no number out of a float's range)
nested at most ``MAX_JSON_DEPTH`` levels deep.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from psycopg import conninfo as pg_conninfo

from dex.adapters.postgres.connection import dsn_problem
from dex.adapters.postgres.schema import validate_schema
from dex.domain.definitions import validate_name, validate_queue
from dex.serialization.payloads import MAX_NESTING
from dex.views.secrets import redact_dsn

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

INT4_MAX = 2**31 - 1  # PostgreSQL integer (a queue's capacity)
INT8_MAX = 2**63 - 1  # PostgreSQL bigint (LIMIT)
MAX_JSON_DEPTH = MAX_NESTING  # arrays and objects inside each other: as deep as any payload may nest


def text_problem(value: str) -> str | None:
    """Why ``value`` is no text PostgreSQL can store, or None if it is."""
    if "\x00" in value:
        return "contains a NUL character"
    return _utf8_problem(value)


def _utf8_problem(value: str) -> str | None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text (it holds a lone surrogate, which is what bytes that are not UTF-8 become)"
    return None


class Text(click.ParamType[Any, Any]):
    """A string PostgreSQL can store: no NUL character, no lone surrogate."""

    def __init__(self, name: str = "TEXT") -> None:
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        problem = text_problem(text)
        if problem is not None:
            self.fail(f"{text!r} {problem}", param, ctx)
        return text


class Dsn(click.ParamType[Any, Any]):
    """A PostgreSQL DSN libpq can read; a bad one is shown with its password redacted."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if isinstance(value, str) and value == "":
            return value  # as if not given: DEX_DATABASE_URL, or the embedded server, as before
        problem = dsn_problem(value) or dsn_value_problem(value)
        if problem is not None:
            shown = redact_dsn(value)
            self.fail(f"{shown if shown.strip() else repr(shown)} is no PostgreSQL DSN: {problem}", param, ctx)
        return str(value)


# libpq checks these only when it connects, after resolving the host (a "database error", exit
# code 1, or a wait for a host that is not there); they are wrong on the DSN's face all the same
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "sslcertmode": ("disable", "allow", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}
_INTEGERS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
_INTEGER = re.compile(r"^\s*[-+]?\d+\s*$")


def dsn_value_problem(dsn: str) -> str | None:
    """Why a DSN libpq can read has a setting libpq would refuse when it connects (an unknown
    sslmode, a connect_timeout that is no number), or None. The settings checked hold no secret,
    so their values are shown."""
    params = pg_conninfo.conninfo_to_dict(dsn)
    for key, allowed in _CHOICES.items():
        value = params.get(key)
        if value is not None and str(value) not in allowed:
            return f"its {key} is {str(value)!r}, not one of {', '.join(allowed)}"
    for key in _INTEGERS:
        value = params.get(key)
        if value is not None and not _INTEGER.match(str(value)):
            return f"its {key} is {str(value)!r}, not a whole number"
    return None


class Secret(click.ParamType[Any, Any]):
    """Text that is never shown, not even when it is refused (a token)."""

    name = "TEXT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        problem = text_problem(text)
        if problem is not None:
            self.fail(f"the value given (not shown: it is a secret) {problem}", param, ctx)
        return text


class Seconds(click.FloatRange):
    """A number of seconds from 0 to what a thread can wait for (``threading.TIMEOUT_MAX``); not NaN."""

    name = "SECONDS"

    def __init__(self) -> None:
        super().__init__(min=0, max=threading.TIMEOUT_MAX)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):  # FloatRange lets NaN by: it compares False with both bounds
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


class TextPath(click.Path):
    """A ``click.Path`` whose name is text first (a NUL would reach ``os.stat`` as a ValueError)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and (problem := text_problem(value)) is not None:
            self.fail(f"{value!r} {problem}", param, ctx)
        return super().convert(value, param, ctx)


class Label(click.ParamType[Any, Any]):
    """``key=value``; the value may be empty, the key may not."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        problem = text_problem(str(value))
        if problem is not None:
            self.fail(f"{value!r} {problem}", param, ctx)
        key, sep, label_value = str(value).partition("=")
        if not sep or not key:
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key, label_value


class Moment(click.ParamType[Any, Any]):
    """An ISO 8601 date or time (UTC unless it names an offset), or an age such as ``30m``,
    ``2h``, ``7d`` (that long before now)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        relative = _RELATIVE.match(text)
        if relative:
            amount, unit = relative.groups()
            try:
                return datetime.now(UTC) - timedelta(**{_UNITS[unit]: float(amount)})
            except OverflowError:  # more than the ~10,000 years a datetime spans
                self.fail(f"{value!r} is further back than a date can go (year 1)", param, ctx)
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            self.fail(
                f"{value!r} is neither an ISO 8601 time (2025-05-01T12:00:00Z) nor an age (30m, 2h, 7d)", param, ctx
            )
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class JsonValue(click.ParamType[Any, Any]):
    """JSON text; ``@PATH`` reads it from a file, ``-`` from standard input."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        source = "the payload"
        if text == "-":
            text, source = sys.stdin.read(), "standard input"
        elif text.startswith("@"):
            try:
                text, source = Path(text[1:]).read_text(encoding="utf-8"), text[1:]
            except OSError as exc:
                self.fail(f"cannot read {text[1:]!r}: {exc.strerror}", param, ctx)
        try:
            value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
        except RecursionError:
            self.fail(f"{source} is nested more than {MAX_JSON_DEPTH} levels deep", param, ctx)
        except ValueError as exc:
            self.fail(f"{source} is not valid JSON: {exc}", param, ctx)
        problem = _json_problem(value)
        if problem is not None:
            self.fail(f"{source} {problem}", param, ctx)
        return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {shorten(text)} is out of range")
    return number


def _json_problem(value: Any) -> str | None:
    """Why a parsed payload cannot be sent (too deep, a string PostgreSQL cannot store), or None.

    Iterative, so a deep payload is measured, not a RecursionError."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return f"is nested more than {MAX_JSON_DEPTH} levels deep"
            if isinstance(item, dict):
                pending.extend((key, depth) for key in item)
                pending.extend((child, depth + 1) for child in item.values())
            else:
                pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and (problem := _utf8_problem(item)) is not None:  # a NUL is fine in a payload
            return f"holds the string {shorten(repr(item))}, which {problem}"
    return None


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Checked(click.ParamType[Any, Any]):
    """A string that one of dex's own validators accepts."""

    def __init__(self, name: str, check: Any) -> None:
        self.name = name
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        problem = text_problem(str(value))
        if problem is not None:
            self.fail(f"{value!r} {problem}", param, ctx)
        try:
            return str(self._check(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


class NumbersMayBeNegative(click.Command):
    """A command whose arguments may be negative numbers: click takes ``-3`` for an option it
    does not know ("No such option '-3'"), so the type never gets to say what range it takes.
    When every unknown option on the line is a negative number, they are arguments (and the
    argument's type refuses them with its range); any other unknown option is still an error."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        if self._only_numbers_unknown(args):
            extra.setdefault("ignore_unknown_options", True)
        return super().make_context(info_name, args, parent, **extra)

    def _only_numbers_unknown(self, args: list[str]) -> bool:
        known = {"-h", "--help"}
        for param in self.params:
            if isinstance(param, click.Option):
                known.update(param.opts, param.secondary_opts)
        options = args[: args.index("--")] if "--" in args else args
        unknown = [arg for arg in options if arg.startswith("-") and arg.partition("=")[0] not in known]
        return bool(unknown) and all(_NEGATIVE_NUMBER.match(arg) for arg in unknown)


TEXT = Text()
DSN = Dsn()
SECRET = Secret()
RUN_ID = Text("RUN_ID")
LABEL = Label()
MOMENT = Moment()
JSON_VALUE = JsonValue()
QUEUE_NAME = _Checked("QUEUE", validate_queue)
EVENT_ID = _Checked("EVENT_ID", lambda value: validate_name(value, "event id"))
SCHEDULE_NAME = _Checked("SCHEDULE", lambda value: validate_name(value, "schedule name"))
SCHEMA = _Checked("SCHEMA", validate_schema)
LIMIT = click.IntRange(min=1, max=INT8_MAX)
CAPACITY = click.IntRange(min=1, max=INT4_MAX)
SECONDS = Seconds()
SEQUENCE = click.IntRange(min=1, max=INT4_MAX)  # a sequence number of a history (an int4 column)
