"""Fire times of schedules (docs/reference/contract.md §10): cron in a time zone, or a fixed interval; and jitter.

The one module that knows croniter. croniter matches cron fields against *wall-clock*
(naive) times; this module maps each matching wall time to one instant in the schedule's
zone under docs/reference/contract.md §10's daylight-saving rules, so croniter's own (historically fragile)
handling of aware datetimes is never relied on:

- a wall time in a spring-forward gap fires once, at the first instant after the gap
  (several fire times in one gap merge into that fire, as they map to the same instant);
- a wall time that happens twice (fall back) fires at its first occurrence only.

All fire times are whole seconds, aware, in UTC. Pure functions of their arguments: no
clock is read here.

What a :class:`dex.Schedule` may say is bounded so that every time derived from it can be
represented: periods (``every``, ``jitter``, ``catchup_window``) up to
:data:`LONGEST_PERIOD`, times (``start_at``, ``end_at``) between :data:`EARLIEST_TIME` and
:data:`LATEST_TIME`, a time zone that IANA names (never ``localtime``, which is whatever the
host says), and cron ranges that go upwards. A fire time that cannot be computed all the same
(a definition stored before these checks) raises :class:`UncomputableFireError`.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import (  # type: ignore[import-untyped,unused-ignore]  # croniter ships no type hints
    CroniterBadCronError,
    CroniterBadDateError,
    CroniterError,
    croniter,
)

from dex.app.ports.schedules import ScheduleDefinition

_SECOND = timedelta(seconds=1)
# a probe for expressions that never match (30 February): croniter gives up after this many years
_MAX_YEARS = 50

# Bounds of what a schedule may say. A period of a century is longer than any schedule needs;
# with times up to the year 9000, a fire, its jitter and a cron's next match (at most
# _MAX_YEARS later) all stay far inside what a datetime holds (the year 9999).
LONGEST_PERIOD = timedelta(days=36525)  # 100 years
EARLIEST_TIME = datetime(1900, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9000, 1, 1, tzinfo=UTC)


class UncomputableFireError(ValueError):
    """A schedule's next fire time cannot be computed (out of range, or a stored definition
    that these bounds would refuse today)."""


def check_period(value: object, field: str, *, minimum: timedelta) -> timedelta:
    """``value`` if it is a timedelta from ``minimum`` to :data:`LONGEST_PERIOD`; else ValueError."""
    if not isinstance(value, timedelta):
        raise ValueError(f"{field} must be a datetime.timedelta, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{field} must be at least {minimum}, got {value}")
    if value > LONGEST_PERIOD:
        raise ValueError(f"{field} must be at most {LONGEST_PERIOD.days} days (100 years), got {value}")
    return value


def check_time(value: object, field: str) -> datetime | None:
    """``value`` if it is None or an aware datetime from :data:`EARLIEST_TIME` to
    :data:`LATEST_TIME`; else ValueError."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{field} must be an aware datetime (with a tzinfo), got {value!r}")
    try:
        in_range = EARLIEST_TIME <= value <= LATEST_TIME
    except OverflowError:  # an offset that takes it past what a datetime holds
        in_range = False
    if not in_range:
        raise ValueError(
            f"{field} must lie between {EARLIEST_TIME:%Y-%m-%d} and {LATEST_TIME:%Y-%m-%d} (UTC), got {value.isoformat()}"
        )
    return value


_UNKNOWN_ZONE = "unknown timezone {!r}: give an IANA name such as 'Europe/Berlin' or 'UTC'"


def check_zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name``, refusing names IANA does not list: ``localtime`` (and the
    like: ``posixrules``, ``posix/...``, ``right/...``) are files of the host's time-zone
    database, whose rules differ from host to host, so fire times would depend on the machine
    that computes them."""
    found = zone(name)
    assert isinstance(name, str)
    if name not in _iana_names():
        if name in ("localtime", "posixrules") or name.startswith(("posix/", "right/")):
            raise ValueError(
                f"timezone {name!r} names the host's own zone, so fire times would depend on the machine: "
                "give an IANA name such as 'Europe/Berlin' or 'UTC'"
            )
        raise ValueError(_UNKNOWN_ZONE.format(name))
    return found


@cache
def _iana_names() -> frozenset[str]:
    """The zone names of the IANA database as the ``tzdata`` package lists them."""
    listing = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in listing.splitlines() if line.strip())


def zone(name: object) -> ZoneInfo:
    """The time zone ``name``; ValueError naming it when there is no such zone. (A new
    schedule's zone is checked by :func:`check_zone`; a stored one is only looked up.)"""
    if not isinstance(name, str) or not name or "\x00" in name or not name.isascii() or len(name) > 64:
        raise ValueError(_UNKNOWN_ZONE.format(name))
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(_UNKNOWN_ZONE.format(name)) from None


def check_cron(expression: object) -> str:
    """Return ``expression`` if it is a cron expression of 5 fields, or 6 with seconds first,
    that fires at least once; else ValueError naming the problem."""
    if not isinstance(expression, str) or "\x00" in expression or not expression.isascii():
        raise ValueError(f"invalid cron expression {expression!r}: it must be a str of 5 or 6 fields")
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            f"invalid cron expression {expression!r}: it has {len(fields)} fields, not 5 "
            "(minute hour day month weekday) or 6 (second first)"
        )
    _check_ranges(expression, fields)
    try:
        if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6, strict=True):
            raise ValueError(f"invalid cron expression {expression!r}: a field is out of range or malformed")
        _iterator(expression, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterBadDateError, CroniterBadCronError, CroniterError):
        raise ValueError(f"invalid cron expression {expression!r}: it never fires") from None
    return expression


# each field's name and its smallest and largest value
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of the month", 1, 31), ("month", 1, 12), ("day of the week", 0, 6))
_NAMED = {
    **{name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
    **{
        name: number + 1
        for number, name in enumerate(
            ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
        )
    },
}


def _check_ranges(expression: str, fields: list[str]) -> None:
    """Refuse a range that does not go upwards (``5-4``, ``1-1``): croniter reads a reversed
    range as wrapping around, and one of a single value as the whole field (``5-4`` and
    ``1-1`` in the minutes both fire every minute), where cron means something else."""
    kinds = (("second", 0, 59), *_FIELDS) if len(fields) == 6 else _FIELDS
    for field, (name, smallest, largest) in zip(fields, kinds, strict=True):
        for part in field.split(","):
            span, slash, step = part.partition("/")
            low, dash, high = span.partition("-")
            first, last = _number(low), _number(high)
            if not dash or first is None or last is None or first < last:
                continue
            if first == last:
                advice = f"write {low}{slash}{step} alone"
            else:
                upper = low if first >= largest else f"{low}-{largest}"
                lower = high if last <= smallest else f"{smallest}-{high}"
                advice = f"a range that wraps around is written as two: {upper}{slash}{step},{lower}{slash}{step}"
            raise ValueError(
                f"invalid cron expression {expression!r}: the range {part!r} in the {name} field "
                f"does not go upwards ({advice})"
            )


def _number(text: str) -> int | None:
    if text.isascii() and text.isdigit():
        return int(text)
    return _NAMED.get(text.lower())


def check_cron_fires_after(expression: str, tz: ZoneInfo, start: datetime) -> None:
    """ValueError unless ``expression`` has a fire time at or after ``start`` that a datetime
    holds (the bounds on ``start_at`` make it so for every expression :func:`check_cron` lets
    by; this keeps it so should they change)."""
    try:
        next_cron_fire(expression, tz, start - timedelta(microseconds=1))
    except (OverflowError, ValueError, CroniterError):
        raise ValueError(
            f"cron expression {expression!r} has no fire time after start_at {start.isoformat()}"
        ) from None


def _iterator(expression: str, start: datetime) -> croniter:
    six = len(expression.split()) == 6
    return croniter(expression, start, second_at_beginning=six, max_years_between_matches=_MAX_YEARS)


def instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant at which wall-clock time ``wall`` (naive) fires in ``tz``: its first
    occurrence when it happens twice, the end of the gap when it does not happen."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first  # exists (fold=0 is the first occurrence of a repeated time)
    # in a gap: fold=0 and fold=1 read the wall time with the offsets before and after the
    # transition, and the transition lies between the two instants; find its first second
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    low, high = min(first, second), max(first, second)
    after = high.astimezone(tz).utcoffset()
    while high - low > _SECOND:  # invariant: high has the offset after the transition
        middle = (low + (high - low) / 2).replace(microsecond=0)
        if middle.astimezone(tz).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high


def next_cron_fire(expression: str, tz: ZoneInfo, after: datetime) -> datetime:
    """The first fire time of ``expression`` in ``tz`` strictly after the instant ``after``."""
    after = after.astimezone(UTC)
    # the wall times after the wall time of `after`: one at or before it never maps past it
    # (a gap's wall times map forward only to the gap's end, which lies after them too)
    cursor = _iterator(expression, after.astimezone(tz).replace(tzinfo=None))
    while True:
        wall = cursor.get_next(datetime)
        fire = instant(wall, tz)
        if fire > after:
            return fire


def next_every_fire(start_at: datetime, every: timedelta, after: datetime) -> datetime:
    """The first of ``start_at + k·every`` (k >= 0) strictly after ``after``."""
    if after < start_at:
        return start_at
    steps = (after - start_at) // every + 1
    return start_at + steps * every


def jitter_offset(name: str, fire_at: datetime, jitter: timedelta) -> timedelta:
    """A deterministic offset in ``[0, jitter)`` from the schedule's name and fire time, so every
    engine (and every retry after a crash) agrees on when a fire starts."""
    micros = jitter // timedelta(microseconds=1)
    if micros <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{name}\n{fire_at.isoformat()}".encode("utf-8", "surrogatepass")).digest()
    return timedelta(microseconds=int.from_bytes(digest[:8], "big") % micros)


def iso_second(moment: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ``: how a fire time is written in instance ids."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def whole_second(moment: datetime) -> datetime:
    """``moment`` in UTC, without its fraction of a second."""
    return moment.astimezone(UTC).replace(microsecond=0)


def ceil_second(moment: datetime) -> datetime:
    """``moment`` in UTC, rounded up to a whole second."""
    whole = whole_second(moment)
    return whole if whole == moment else whole + _SECOND


def next_fire(definition: ScheduleDefinition, anchor: datetime, after: datetime) -> datetime | None:
    """The schedule's first fire time strictly after ``after``, within ``start_at``..``end_at``
    (both inclusive); None when there is none. ``anchor`` is when an ``every`` schedule without
    ``start_at`` counts from: its creation. :class:`UncomputableFireError` (a ValueError naming
    the schedule) when it cannot be computed."""
    try:
        return _next_fire(definition, anchor, after)
    except UncomputableFireError:
        raise
    except (OverflowError, ValueError, CroniterError) as exc:
        reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UncomputableFireError(
            f"schedule {definition.name!r}: its next fire after {after.isoformat()} cannot be computed ({reason})"
        ) from None


def _next_fire(definition: ScheduleDefinition, anchor: datetime, after: datetime) -> datetime | None:
    start = definition.start_at
    if start is not None and after < start:
        after = start - timedelta(microseconds=1)  # start_at itself may fire
    if definition.cron is not None:
        fire = next_cron_fire(definition.cron, zone(definition.timezone), after)
    else:
        assert definition.every is not None
        fire = next_every_fire(ceil_second(start if start is not None else anchor), definition.every, after)
    if definition.end_at is not None and fire > definition.end_at:
        return None
    return fire
