"""Parameter types of the command line, checked before anything touches the database.

A value that is wrong on its face (a label without ``=``, a date that is no date, a queue name
dex would refuse, a payload that is not JSON) is a usage error: exit code 2, and nothing was
sent. Only what the database decides (no such run, an illegal transition) is exit code 1.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from dex.adapters.postgres.schema import validate_schema
from dex.domain.definitions import validate_name, validate_queue

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class Label(click.ParamType[Any, Any]):
    """``key=value``; the value may be empty, the key may not."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
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
            return datetime.now(UTC) - timedelta(**{_UNITS[unit]: float(amount)})
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
            return json.loads(text)
        except ValueError as exc:
            self.fail(f"{source} is not valid JSON: {exc}", param, ctx)


class _Checked(click.ParamType[Any, Any]):
    """A string that one of dex's own validators accepts."""

    def __init__(self, name: str, check: Any) -> None:
        self.name = name
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return str(self._check(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


LABEL = Label()
MOMENT = Moment()
JSON_VALUE = JsonValue()
QUEUE_NAME = _Checked("QUEUE", validate_queue)
EVENT_ID = _Checked("EVENT_ID", lambda value: validate_name(value, "event id"))
SCHEMA = _Checked("SCHEMA", validate_schema)
