"""A queue's limits on its concurrency keys and its rate of starts: the scheduler's and the
claims' rules, stated once for every adapter.

A queue holds three limits. ``capacity`` (how many of its tasks may be claimable or running at
once) is older than this module and kept where it was (``dex.app.ports.store.queue_capacity``);
this module states the two that came with it:

* ``key_concurrency``: how many runs sharing a ``concurrency_key`` hold the key at once on
  the queue (:func:`key_grants`). A queue with 1 keeps the rule of one run at a time per key
  across every queue: its run is granted the key only while no run holds it anywhere, and
  while it holds it no queue grants the key. A queue with n > 1 grants the key to n of its
  own runs at once, counting only its own holders, unless a run of a queue with 1 holds it
  (docs/decisions/key-concurrency-per-queue.md says why).
* ``rate_limit``: at most ``count`` tasks of the queue start (are claimed by a worker) in any
  window of ``period``. A queue with a rate limit has ``count`` start slots; a claim takes a
  slot that is free (:func:`slot_is_free`: its last start is at least ``period`` old) and
  stamps it with its own time, so two starts through one slot are at least ``period`` apart
  and no window of that length holds more than ``count`` starts (a sliding window: no burst
  above ``count``, whenever the window begins).

PostgreSQL keeps a queue's slots in *shares* (:func:`share_sizes`: slot ``i`` in share ``i %
shares``), a row per share holding its slots' last starts as pairs (a moment, how many of the
share's slots last started then: :data:`Stamps`). A claim locks one share per limited queue,
the one whose first slot was free soonest (:func:`free_from`), counts its free slots (the
slots less those still in use: :func:`in_use`) and stamps as many as it starts tasks with one
pair. That is the same rule over the same slots, written once per claim instead of once per
start; a claim whose share has fewer free slots than the queue has takes fewer tasks than the
queue could start (the next claim takes the rest), never more. A change of the count keeps
the newest stamps (:func:`regroup`).

A claimer may also stamp slots *ahead*: take k free slots at its time ``t0``, stamp them with
a later moment ``T``, and start up to k tasks through them at any moment from ``t0`` to ``T``
(:func:`reservation` says when and how many; :func:`may_start_reserved` checks a start). It
stays exact: a start through such a slot comes after its previous start's period ended (the
slot was free at ``t0``) and at or before ``T``, and the next start through it comes at
``T + period`` or later. A slot stamped ahead and not used is lost for ``T - t0`` plus one
period, so only a queue whose limit is far above a claim's batch is reserved, a small part of
its count at a time: the claims of a busy engine then send no slot work with each batch.

The in-memory adapter calls these functions; PostgreSQL's SQL states the same comparisons
(``last_start <= now - period``, the counts and cases of :func:`key_grants`) over the same columns,
and the contract tests (tests/contract/test_queue_limits.py) check both adapters against this
module at the boundaries.

Candidates are considered in :data:`RUN_ORDER` (runs) and :data:`TASK_ORDER` (tasks): the
order the scheduler grants keys and slots in and the order claims take tasks in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

RUN_ORDER: tuple[str, ...] = ("-priority", "created_at", "position")
"""Runs compete for a queue's slots and a key's grants by priority (highest first), then age."""

TASK_ORDER: tuple[str, ...] = ("-priority", "task_id")
"""Claims take tasks by priority (highest first), then in the order they were scheduled."""

MAX_KEY_CONCURRENCY = 2**31 - 1  # a PostgreSQL integer column
MAX_RATE_COUNT = 100_000  # start slots a queue keeps: one row each in PostgreSQL
MIN_RATE_PERIOD = timedelta(milliseconds=1)
SHARES = 32
"""At most this many shares hold a queue's start slots: concurrent claims of a queue take
different shares, and none waits for another (``SKIP LOCKED``)."""
SHARE_SLOTS = 64
"""A share holds at least this many slots (a queue with fewer has one share): a claim takes
its tasks through one share, so a share must cover a claim's batch."""

RESERVED_PART = 32
"""A reservation stamps at most ``count // RESERVED_PART`` slots (and no more than a share has
free): an engine that stops claiming wastes at most that part of the limit."""
RESERVED_BATCHES = 4
"""A queue is reserved for only if a reservation covers at least this many claim batches."""

Stamps = Sequence[tuple[datetime, int]]
"""A share's slots' last starts: pairs (a moment, how many of its slots last started then)."""
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


def key_grants(key_concurrency: int, here: int, elsewhere: int, alone_elsewhere: int) -> int:
    """How many more runs a queue whose key concurrency is ``key_concurrency`` may be granted a
    key that ``here`` live runs of this queue hold and ``elsewhere`` live runs of other queues
    hold, ``alone_elsewhere`` of those on queues whose key concurrency is 1.

    With 1: one, and only while nobody holds the key (one run at a time across queues). With
    n > 1: what is left of n after this queue's own holders, and none while a run of a queue
    with 1 holds the key (that run executes alone)."""
    if key_concurrency == 1:
        return 1 if here + elsewhere == 0 else 0
    if alone_elsewhere:
        return 0
    return max(key_concurrency - here, 0)


def key_holders(holders: Mapping[str, int], concurrency: Mapping[str, int], queue: str) -> tuple[int, int, int]:
    """The counts :func:`key_grants` takes for ``queue``, from a key's live holders per queue
    (``holders``) and the queues' key concurrency (``concurrency``; a queue not in it has 1)."""
    here = holders.get(queue, 0)
    elsewhere = sum(n for name, n in holders.items() if name != queue)
    alone = sum(n for name, n in holders.items() if name != queue and concurrency.get(name, 1) == 1)
    return here, elsewhere, alone


def slot_is_free(last_start: datetime | None, now: datetime, period: timedelta) -> bool:
    """Whether a start slot whose last start was ``last_start`` (None: never) may start a task
    at ``now``: its last start is at least ``period`` old."""
    return last_start is None or last_start <= now - period


def share_sizes(count: int) -> list[int]:
    """How many slots each share of a queue limited to ``count`` starts holds: slot ``i`` is
    in share ``i % shares``, with as many shares as hold :data:`SHARE_SLOTS` each, from one
    to :data:`SHARES`."""
    shares = max(1, min(SHARES, count // SHARE_SLOTS))
    return [len(range(share, count, shares)) for share in range(shares)]


def in_use(stamps: Stamps, now: datetime, period: timedelta) -> int:
    """How many of a share's slots are not free at ``now`` (:func:`slot_is_free`)."""
    return sum(n for last_start, n in stamps if not slot_is_free(last_start, now, period))


def free_from(stamps: Stamps, slots: int, period: timedelta) -> datetime | None:
    """When the first of a share's ``slots`` is free, given its stamps: None (PostgreSQL's
    ``-infinity``) while a slot has no stamp, else its oldest stamp plus ``period``."""
    if sum(n for _, n in stamps) < slots:
        return None
    return min(last_start for last_start, _ in stamps) + period


def regroup(stamps: Stamps, count: int) -> list[list[tuple[datetime, int]]]:
    """A queue's stamps (of every share) for a new count: the newest ``count`` slots' stamps
    kept, newest first, filling the shares of :func:`share_sizes` in order. Lowering the
    count keeps the most recent starts, so it lets no burst through; new slots are free."""
    shares: list[list[tuple[datetime, int]]] = []
    newest = sorted(stamps, key=lambda stamp: stamp[0], reverse=True)
    for size in share_sizes(count):
        share: list[tuple[datetime, int]] = []
        while size and newest:
            last_start, n = newest.pop(0)
            taken = min(n, size)
            share.append((last_start, taken))
            size -= taken
            if n > taken:
                newest.insert(0, (last_start, n - taken))
        shares.append(sorted(share))
    return shares


def reservation(limit: RateLimit, batch: int) -> tuple[int, timedelta] | None:
    """How many slots a claimer of ``batch`` tasks at a time may stamp ahead on a queue with
    this limit, and how far ahead (a quarter of the period: the slots it does not use are
    free again by then plus one period); None when the limit is not far enough above the
    batch for that to pay (fewer than :data:`RESERVED_BATCHES` batches)."""
    slots = limit.starts // RESERVED_PART
    if slots < RESERVED_BATCHES * batch:
        return None
    return slots, limit.period / 4


def may_start_reserved(now: datetime, reserved_at: datetime, until: datetime) -> bool:
    """Whether a task may start at ``now`` through a slot reserved at ``reserved_at`` and
    stamped ``until``: from the reservation's moment to its stamp, both included."""
    return reserved_at <= now <= until


def _shown(value: object) -> str:
    """A bad value as an error message shows it: its repr, cut short; a repr that raises (a
    hostile object) is shown by its type's name instead."""
    try:
        return f"{value!r:.60}"
    except Exception:  # noqa: BLE001 - the caller's error must not be replaced by the value's own
        return f"a {type(value).__name__}"
