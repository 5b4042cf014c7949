"""Fire times of schedules (SPEC §10): cron in a time zone, or a fixed interval; and jitter.

The one module that knows croniter. croniter matches cron fields against *wall-clock*
(naive) times; this module maps each matching wall time to one instant in the schedule's
zone under SPEC §10's daylight-saving rules, so croniter's own (historically fragile)
handling of aware datetimes is never relied on:

- a wall time in a spring-forward gap fires once, at the first instant after the gap
  (several fire times in one gap merge into that fire, as they map to the same instant);
- a wall time that happens twice (fall back) fires at its first occurrence only.

All fire times are whole seconds, aware, in UTC. Pure functions of their arguments: no
clock is read here.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import (  # type: ignore[import-untyped,unused-ignore]  # croniter ships no type hints
    CroniterBadCronError,
    CroniterBadDateError,
    CroniterError,
    croniter,
)

from dex.app.schedule_ports import ScheduleDefinition

_SECOND = timedelta(seconds=1)
# a probe for expressions that never match (30 February): croniter gives up after this many years
_MAX_YEARS = 50


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError naming it when there is no such zone."""
    if not isinstance(name, str) or not name or "\x00" in name or not name.isascii() or len(name) > 64:
        raise ValueError(f"unknown timezone {name!r}: give an IANA name such as 'Europe/Berlin' or 'UTC'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r}: give an IANA name such as 'Europe/Berlin' or 'UTC'") from None


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
    try:
        if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6, strict=True):
            raise ValueError(f"invalid cron expression {expression!r}: a field is out of range or malformed")
        _iterator(expression, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterBadDateError, CroniterBadCronError, CroniterError):
        raise ValueError(f"invalid cron expression {expression!r}: it never fires") from None
    return expression


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
    ``start_at`` counts from: its creation."""
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
