"""How the command line shows things: aligned tables, JSON documents, times, durations and values.

Every command prints a table (or a few ``key  value`` lines) by default and a JSON document
with ``--json``. Both are built here from the engine's own objects, so the two formats always
carry the same facts. Times are shown in UTC, ISO 8601 (``2025-05-01T12:00:03Z``), so that a
value copied from a table can be pasted into ``--created-after``.
"""

from __future__ import annotations

import base64
import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

from dex.app.ports.store import RunRecord
from dex.app.schedules.spec import ScheduleInfo
from dex.domain.errors import SerializationError
from dex.domain.queue_limits import RateLimit
from dex.domain.values import FailureInfo, Payload, describe_failure
from dex.serialization.payloads import PayloadConverter

_converter = PayloadConverter()


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, headers first; trailing blanks trimmed."""
    cells = [list(headers), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def fields(pairs: Iterable[tuple[str, str]]) -> str:
    """``key  value`` lines with the values aligned (a vertical table for one object)."""
    pairs = list(pairs)
    width = max((len(key) for key, _ in pairs), default=0)
    return "\n".join(f"{key.ljust(width)}  {value}".rstrip() for key, value in pairs)


def dumps(value: Any) -> str:
    """A JSON document of ``value`` (see :func:`jsonable`), indented for reading; strict JSON
    (``allow_nan=False``: :func:`jsonable` has turned NaN and the infinities into strings)."""
    return json.dumps(jsonable(value), indent=2, ensure_ascii=False, allow_nan=False)


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: attrs classes become objects, payloads their decoded values,
    times ISO 8601 strings, durations seconds, statuses their names, bytes base64. A float
    JSON cannot hold becomes the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Payload):
        return jsonable_payload(value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, ProtoMessage):
        return json_format.MessageToDict(value)
    if attrs.has(type(value)):
        return {
            field.name: dict(getattr(value, field.name))
            if field.name == "labels"
            else jsonable(getattr(value, field.name))
            for field in attrs.fields(type(value))
        }
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple (a queue's RateLimit): by name
        return {name: jsonable(item) for name, item in zip(value._fields, value, strict=True)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    return repr(value)


def decode(payload: Payload) -> Any:
    """The value in a payload, decoded without a type hint; raises SerializationError."""
    return _converter.decode(payload)


def jsonable_payload(payload: Payload) -> Any:
    """A payload's value as JSON data; one that cannot be decoded here is shown raw."""
    try:
        return jsonable(decode(payload))
    except SerializationError:
        raw: dict[str, Any] = {"encoding": payload.encoding, "base64": base64.b64encode(payload.data).decode("ascii")}
        if payload.message_type:
            raw["message_type"] = payload.message_type
        return raw


def show_payload(payload: Payload | None, limit: int | None = 80) -> str:
    """A payload's value on one line: compact JSON, ``<N bytes>``, or a protobuf message's name."""
    if payload is None:
        return "-"
    try:
        value = decode(payload)
    except SerializationError:
        text = f"<{payload.message_type or payload.encoding}, {len(payload.data)} bytes>"
    else:
        text = show_value(value, limit=None)
    return shorten(text, limit)


def show_value(value: Any, limit: int | None = 80) -> str:
    """A decoded value on one line."""
    if isinstance(value, bytes):
        text = f"<{len(value)} bytes>"
    elif isinstance(value, ProtoMessage):
        body = json.dumps(json_format.MessageToDict(value), ensure_ascii=False, separators=(", ", ": "))
        text = f"{value.DESCRIPTOR.full_name} {body}"
    else:
        text = json.dumps(jsonable(value), ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
    return shorten(text, limit)


def show_args(payloads: Sequence[Payload], limit: int | None = 80) -> str:
    """Arguments as a call would show them: ``("A-1", 4200)``."""
    return shorten("(" + ", ".join(show_payload(p, limit=None) for p in payloads) + ")", limit)


def shorten(text: str, limit: int | None) -> str:
    text = " ".join(text.split("\n"))
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def show_failure(failure: FailureInfo | None) -> str:
    return "-" if failure is None else describe_failure(failure)


def iso(moment: datetime) -> str:
    """UTC, to the second unless it has a fraction: ``2025-05-01T12:00:03Z``."""
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def show_time(moment: datetime | None, *, millis: bool = False) -> str:
    """UTC to the second (or the millisecond): ``2025-05-01T12:00:03Z``; ``-`` for None."""
    if moment is None:
        return "-"
    moment = moment.astimezone(UTC)
    fraction = f".{moment.microsecond // 1000:03d}" if millis else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def show_duration(delta: timedelta) -> str:
    """``850ms``, ``12.3s``, ``4m05s``, ``3h07m``, ``2d04h``."""
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def show_labels(labels: Iterable[tuple[str, str]] | Mapping[str, str]) -> str:
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return ",".join(f"{key}={value}" for key, value in pairs) or "-"


def show_schedule_timing(info: ScheduleInfo) -> str:
    """When a schedule fires, as ``dex schedules`` and the dashboard both say it:
    ``cron '0 3 * * *' Europe/Berlin`` or ``every 1h00m``."""
    if info.cron is not None:
        return f"cron {info.cron!r} {info.timezone}"
    return f"every {show_duration(info.every)}" if info.every is not None else "-"


def show_schedule_status(info: ScheduleInfo) -> str:
    """``ACTIVE`` or ``PAUSED``: the words of the JSON API's ``status`` too."""
    return "PAUSED" if info.paused else "ACTIVE"


def run_json(record: RunRecord) -> dict[str, Any]:
    """A run as a JSON object, with the fields of :class:`dex.RunInfo` (plus ``queue``)."""
    return {
        "run_id": record.run_id,
        "workflow_name": record.workflow_name,
        "instance_id": record.instance_id,
        "status": record.status.value,
        "custom_status": record.custom_status,
        "queue": record.queue,
        "priority": record.priority,
        "concurrency_key": record.concurrency_key,
        "labels": dict(record.labels),
        "parent_run_id": record.parent_run_id,
        "created_at": jsonable(record.created_at),
        "started_at": jsonable(record.started_at),
        "completed_at": jsonable(record.completed_at),
        "result": jsonable(record.result),
        "failure": jsonable(record.failure),
        "code_version": record.code_version,
        "task_failure": jsonable(record.task_failure),
        "forked_from": record.forked_from,
        "deadline": jsonable(record.deadline),
        "unread_events": record.unread_events,
    }


def runs_table(records: Sequence[RunRecord]) -> str:
    rows = [
        (
            r.run_id,
            r.workflow_name,
            r.status.value,
            show_time(r.created_at),
            show_duration(r.completed_at - r.created_at) if r.completed_at else "-",
            shorten(show_labels(r.labels), 40),
            shorten(r.custom_status or "-", 40),
        )
        for r in records
    ]
    return table(("RUN ID", "WORKFLOW", "STATUS", "CREATED", "TOOK", "LABELS", "CUSTOM STATUS"), rows)


PERIOD_UNITS: tuple[tuple[str, timedelta], ...] = (
    ("d", timedelta(days=1)),
    ("h", timedelta(hours=1)),
    ("m", timedelta(minutes=1)),
    ("s", timedelta(seconds=1)),
    ("ms", timedelta(milliseconds=1)),
)
"""The units of a rate limit's period as the command line and the dashboard write it."""


def rate_text(rate: RateLimit | None) -> str:
    """A queue's rate limit as ``N/PERIOD`` in the largest unit that divides the period
    (``10/s``, ``600/5m``, ``1/250ms``; ``dex queues rate-limit`` reads the same), ``-`` for none."""
    if rate is None:
        return "-"
    for unit, size in PERIOD_UNITS:
        if rate.period % size == timedelta(0):
            count = rate.period // size
            return f"{rate.starts}/{'' if count == 1 else count}{unit}"
    return f"{rate.starts}/{rate.period.total_seconds() * 1000:g}ms"
