"""A queue's limits on its concurrency keys and its rate of starts: the scheduler's and the
claims' rules, stated once for every adapter.

A queue holds three limits. ``capacity`` (how many of its tasks may be claimable or running at
once) is older than this module and kept where it was (``dex.app.ports.store.queue_capacity``);
this module states the two that came with it:

* ``key_concurrency``: how many runs sharing a ``concurrency_key`` hold the key at once when
  the queue's scheduler grants it (:func:`key_grants`). Every live holder of the key counts,
  on whichever queue it runs, so 1 is exactly the rule of one run at a time per key.
* ``rate_limit``: at most ``count`` tasks of the queue start (are claimed by a worker) in any
  window of ``period``. A queue with a rate limit has ``count`` start slots; a claim takes a
  slot that is free (:func:`slot_is_free`: its last start is at least ``period`` old) and
  stamps it with its own time, so two starts through one slot are at least ``period`` apart
  and no window of that length holds more than ``count`` starts (a sliding window: no burst
  above ``count``, whenever the window begins).

The in-memory adapter calls these functions; PostgreSQL's SQL states the same comparisons
(``key_rank + holders <= key_concurrency``, ``last_start <= now - period``) over the same
columns, and the contract tests (tests/contract/test_queue_limits.py) check both adapters
against this module at the boundaries.

Candidates are considered in :data:`RUN_ORDER` (runs) and :data:`TASK_ORDER` (tasks): the
order the scheduler grants keys and slots in and the order claims take tasks in.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

RUN_ORDER: tuple[str, ...] = ("-priority", "created_at", "position")
"""Runs compete for a queue's slots and a key's grants by priority (highest first), then age."""

TASK_ORDER: tuple[str, ...] = ("-priority", "task_id")
"""Claims take tasks by priority (highest first), then in the order they were scheduled."""

MAX_KEY_CONCURRENCY = 2**31 - 1  # a PostgreSQL integer column
MAX_RATE_COUNT = 100_000  # start slots a queue keeps: one row each in PostgreSQL
MIN_RATE_PERIOD = timedelta(milliseconds=1)
MAX_RATE_PERIOD = timedelta(days=366)


class RateLimit(NamedTuple):
    """At most ``starts`` starts of a queue's tasks in any window of ``period``. A named pair,
    so ``(10, timedelta(seconds=1))`` and ``RateLimit(10, timedelta(seconds=1))`` are equal."""

    starts: int
    period: timedelta


def key_concurrency(n: object) -> int:
    """``n`` if a queue can have it as its key concurrency (an int from 1 to
    ``MAX_KEY_CONCURRENCY``), else a ValueError naming the range."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_KEY_CONCURRENCY:
        raise ValueError(f"key_concurrency must be an int from 1 to {MAX_KEY_CONCURRENCY}, got {_shown(n)}")
    return n


def rate_limit(value: object) -> RateLimit | None:
    """``value`` as a :class:`RateLimit` (given as a pair ``(count, period)``), or None for no
    limit; a ValueError that says what is wrong otherwise. ``count`` is an int from 1 to
    ``MAX_RATE_COUNT``; ``period`` a ``timedelta`` from a millisecond to 366 days, whole
    microseconds."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise ValueError(f"rate_limit must be None or a pair (count, timedelta), got {_shown(value)}")
    count, period = value
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RATE_COUNT:
        raise ValueError(f"a rate limit's count must be an int from 1 to {MAX_RATE_COUNT}, got {_shown(count)}")
    if not isinstance(period, timedelta) or not MIN_RATE_PERIOD <= period <= MAX_RATE_PERIOD:
        raise ValueError(
            f"a rate limit's period must be a timedelta from {MIN_RATE_PERIOD} to {MAX_RATE_PERIOD.days} days,"
            f" got {_shown(period)}"
        )
    return RateLimit(count, period)


def key_grants(holders: int, key_concurrency: int) -> int:
    """How many more runs may be granted a key that ``holders`` live runs hold, on a queue
    whose key concurrency is ``key_concurrency`` (none once it is reached)."""
    return max(key_concurrency - holders, 0)


def slot_is_free(last_start: datetime | None, now: datetime, period: timedelta) -> bool:
    """Whether a start slot whose last start was ``last_start`` (None: never) may start a task
    at ``now``: its last start is at least ``period`` old."""
    return last_start is None or last_start <= now - period


def _shown(value: object) -> str:
    """A bad value as an error message shows it: its repr, cut short; a repr that raises (a
    hostile object) is shown by its type's name instead."""
    try:
        return f"{value!r:.60}"
    except Exception:  # noqa: BLE001 - the caller's error must not be replaced by the value's own
        return f"a {type(value).__name__}"
