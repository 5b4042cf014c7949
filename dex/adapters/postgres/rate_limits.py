"""Claims when some queue of the kind has a rate limit: each task of a limited queue started
takes a free start slot, or one this engine reserved ahead.

A queue with a rate limit keeps its start slots in shares (migration 19,
``queue_limits.share_sizes``): a row per share with its slots' last starts as pairs (a moment,
how many slots last started then), and two functions of the schema that read and write them
(``share_free``, ``share_stamped``: ``queue_limits.in_use`` and ``free_from`` in SQL).

Through the shares, one statement claims from every queue of the kind that the operator has
not paused: from an unlimited queue up to the claim's limit, as the plain claim does; from a
limited one up to the free slots of the one share it locks, soonest free first, ``FOR UPDATE
SKIP LOCKED``: a concurrent claim takes another share and waits for none, so the limit holds
across every engine without a row that all of them update. The share used gets one pair (the
claim's time, how many it started), the pairs a period old dropped.

Through reservations (:class:`Reservations`, ``queue_limits.reservation``): on a queue whose
limit is far above a claim's batch, the engine stamps free slots of a share a quarter period
ahead (:func:`reserve_starts`) and starts tasks through them until then, with the plain claim's
statement over the unlimited queues and the reserved ones (:func:`claim_reserved_workflow_tasks`):
no slot work with each claim. :func:`claim_with_limits` chooses.

The plain claims (:mod:`.workflow_tasks`, :mod:`.activity_tasks`) keep their statements and
their plans: they skip every queue whose generated ``paused`` is true, which a rate limit makes
it (migration 15). So these statements replace them only when this engine knows of a limited
queue of the kind (:class:`LimitedQueues`: read at most every second); a limit set elsewhere is
honoured at once (the plain claims skip the queue), and its tasks are claimed here within that
second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

import psycopg

from dex.adapters.postgres import activity_tasks, arrays, attempts, workflow_tasks
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.rows import ACTIVITY_TASK_COLUMNS, WORKFLOW_TASK_COLUMNS
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import ActivityTask, WorkflowTask
from dex.domain import queue_limits
from dex.domain.queue_limits import RateLimit

RESERVE_AHEAD = 16  # reserve again while the starts held still cover this many claims

log = logging.getLogger("dex.worker")

# Per limited queue of the kind (not paused by the operator), the share it locks, soonest free
# first, with its free slots; per queue, its best tasks up to the claim's limit (a limited
# queue: up to its share's free slots, none without a share); the best overall up to the
# limit; and each share used stamped with one pair (the claim's time, how many tasks of its
# queue were taken), the pairs a period old dropped. KIND and TASKS are filled in below.
_CLAIM = """
    WITH shares AS (
        SELECT qu.name AS queue, st.share, st.slots, st.recent, st.counts,
               qu.rate_period_us * interval '1 microsecond' AS period,
               {s}.share_free(st.recent, st.counts, st.slots, %(now)s - qu.rate_period_us * interval '1 microsecond')
                   AS free
        FROM {s}.queues qu CROSS JOIN LATERAL (
            SELECT sh.share, sh.slots, sh.recent, sh.counts FROM {s}.queue_start_shares sh
            WHERE sh.kind = 'KIND' AND sh.queue = qu.name AND sh.free_at <= %(now)s
            ORDER BY sh.free_at
            LIMIT 1
            FOR UPDATE OF sh SKIP LOCKED
        ) st
        WHERE qu.kind = 'KIND' AND qu.rate_count IS NOT NULL AND NOT qu.operator_paused
    ),
    chosen AS (
        SELECT w.* FROM {s}.queues qu LEFT JOIN shares s ON s.queue = qu.name
        CROSS JOIN LATERAL (TASKS) w
        WHERE qu.kind = 'KIND' AND NOT qu.operator_paused
        ORDER BY w.priority DESC, w.task_id
        LIMIT %(limit)s
    ),
    stamped AS (
        UPDATE {s}.queue_start_shares st
        SET recent = n.kept_recent, counts = n.kept_counts, free_at = n.free_at
        FROM shares s
        JOIN (SELECT c.queue, count(*)::integer AS n FROM chosen c GROUP BY c.queue) c ON c.queue = s.queue
        CROSS JOIN LATERAL {s}.share_stamped(s.recent, s.counts, s.slots, %(now)s - s.period, %(now)s, c.n, s.period) n
        WHERE st.kind = 'KIND' AND st.queue = s.queue AND st.share = s.share
    ),
"""

_WORKFLOW_TASKS = """
    SELECT t.queue, t.task_id, t.priority FROM {s}.workflow_tasks t
    WHERE t.queue = qu.name AND t.workflow_name = ANY(%(names)b::text[])
      AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
    ORDER BY t.priority DESC, t.task_id
    LIMIT CASE WHEN qu.rate_count IS NULL THEN %(limit)s ELSE least(coalesce(s.free, 0), %(limit)s) END
    FOR UPDATE OF t SKIP LOCKED
"""

_CLAIM_WORKFLOW_TASKS = (
    _CLAIM.replace("KIND", "workflow").replace("TASKS", _WORKFLOW_TASKS)
    + """
    claimed AS (
        UPDATE {s}.workflow_tasks t
        SET locked_by = %(owner)s, locked_until = %(until)s, lock_version = t.lock_version + 1
        FROM chosen c WHERE t.queue = c.queue AND t.task_id = c.task_id
        RETURNING """
    + ", ".join(f"t.{column.strip()}" for column in WORKFLOW_TASK_COLUMNS.split(","))
    + """
    )
    SELECT * FROM claimed
"""
)

_ACTIVITY_TASKS = """
    SELECT t.queue, t.task_id, t.priority, t.run_id, t.created_seq, t.attempt, t.locked_by, t.locked_until
    FROM {s}.activity_tasks t
    WHERE t.queue = qu.name AND t.state = 'QUEUED' AND t.name = ANY(%(names)b::text[])
      AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
    ORDER BY t.priority DESC, t.task_id
    LIMIT CASE WHEN qu.rate_count IS NULL THEN %(limit)s ELSE least(coalesce(s.free, 0), %(limit)s) END
    FOR UPDATE OF t SKIP LOCKED
"""

# as the plain claim (activity_tasks.send_activity_claim): a task taken over from an expired
# lease counts as a new attempt, and the attempt it lost is kept (``claimable`` is the name
# attempts.LOST_FROM_CLAIM reads)
_CLAIM_ACTIVITY_TASKS = (
    _CLAIM.replace("KIND", "activity").replace("TASKS", _ACTIVITY_TASKS)
    + """
    claimable AS (SELECT * FROM chosen),
    claimed AS (
        UPDATE {s}.activity_tasks t
        SET attempt = t.attempt + CASE WHEN t.locked_by IS NULL THEN 0 ELSE 1 END,
            locked_by = %(owner)s, locked_until = %(now)s + least(t.lock_timeout, %(lease)s),
            lock_version = t.lock_version + 1
        FROM claimable c WHERE t.queue = c.queue AND t.task_id = c.task_id
        RETURNING """
    + ", ".join(f"t.{column.strip()}" for column in ACTIVITY_TASK_COLUMNS.split(","))
    + "), lost AS ("
    + attempts.LOST_FROM_CLAIM
    + ") SELECT * FROM claimed"
)


def claim_workflow_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> list[WorkflowTask]:
    """Claim up to ``limit`` workflow tasks of every queue the operator has not paused, each
    task of a rate-limited queue through a free start slot."""
    return workflow_tasks.claim_workflow_tasks(conn, q, names, owner, now, lease, limit, _CLAIM_WORKFLOW_TASKS)


def claim_activity_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> list[ActivityTask]:
    """Claim up to ``limit`` activity tasks of every queue the operator has not paused, each
    task of a rate-limited queue through a free start slot."""
    return activity_tasks.claim_activity_tasks(conn, q, names, owner, now, lease, limit, _CLAIM_ACTIVITY_TASKS)


# A reservation (queue_limits.reservation): one share of the queue, soonest free first, its
# free slots up to %(want)s stamped %(until)s, ahead of the claim's time; only while the queue
# still has the limit the engine read (a limit changed since is not reserved for).
_RESERVE = """
    WITH sh AS (
        SELECT st.share, st.slots, st.recent, st.counts,
               {s}.share_free(st.recent, st.counts, st.slots, %(now)s - %(period)s) AS free
        FROM {s}.queue_start_shares st JOIN {s}.queues qu ON qu.kind = st.kind AND qu.name = st.queue
        WHERE st.kind = %(kind)s AND st.queue = %(queue)s AND st.free_at <= %(now)s
          AND qu.rate_count = %(count)s AND qu.rate_period_us = %(period_us)s AND NOT qu.operator_paused
        ORDER BY st.free_at
        LIMIT 1
        FOR UPDATE OF st SKIP LOCKED
    )
    UPDATE {s}.queue_start_shares st
    SET recent = n.kept_recent, counts = n.kept_counts, free_at = n.free_at
    FROM sh CROSS JOIN LATERAL {s}.share_stamped(
        sh.recent, sh.counts, sh.slots, %(now)s - %(period)s, %(until)s, least(sh.free, %(want)s), %(period)s
    ) n
    WHERE st.kind = %(kind)s AND st.queue = %(queue)s AND st.share = sh.share AND sh.free > 0
    RETURNING least(sh.free, %(want)s)
"""

# The plain claim's statement over the unlimited queues and the rate-limited ones this engine
# holds reservations of, each with the limit it was reserved under, as 'name/count/period in
# microseconds' (one array; the last two parts are digits, so the text says which queue and
# limit it is even of a name with a '/').
_RESERVED_QUEUES = (
    "t.queue IN (SELECT qu.name FROM {s}.queues qu WHERE qu.kind = 'KIND' AND NOT qu.operator_paused"
    " AND (qu.rate_count IS NULL"
    " OR qu.name || '/' || qu.rate_count || '/' || qu.rate_period_us = ANY(%(reserved)b::text[])))"
)
_CLAIM_RESERVED_WORKFLOW_TASKS = workflow_tasks.CLAIM.replace(
    workflow_tasks.CLAIMED_QUEUES, _RESERVED_QUEUES.replace("KIND", "workflow")
)
_CLAIM_RESERVED_ACTIVITY_TASKS = activity_tasks.CLAIM.replace(
    activity_tasks.CLAIMED_QUEUES, _RESERVED_QUEUES.replace("KIND", "activity")
)
assert "reserved" in _CLAIM_RESERVED_WORKFLOW_TASKS and "reserved" in _CLAIM_RESERVED_ACTIVITY_TASKS


def reserve_starts(
    conn: psycopg.Connection,
    q: Statements,
    kind: str,
    queue: str,
    limit: RateLimit,
    want: tuple[int, timedelta],
    now: datetime,
) -> Reserved | None:
    """Stamp up to ``want[0]`` free slots of one share of the queue ``want[1]`` ahead, for
    starts from ``now`` to then (queue_limits.reservation); None if no share had a free slot
    (or the queue's limit is no longer ``limit``)."""
    until = now + want[1]
    row = conn.execute(
        q(_RESERVE),
        {
            "kind": kind,
            "queue": queue,
            "count": limit.starts,
            "period": limit.period,
            "period_us": limit.period // timedelta(microseconds=1),
            "now": now,
            "until": until,
            "want": want[0],
        },
    ).fetchone()
    if row is None:
        return None
    return Reserved(limit, row[0], now, until)


def _reserved_params(reserved: Mapping[str, RateLimit]) -> dict[str, object]:
    # packed (arrays.py): sent with every claim of a busy engine
    return {
        "reserved": arrays.texts(
            [f"{name}/{limit.starts}/{limit.period // timedelta(microseconds=1)}" for name, limit in reserved.items()]
        )
    }


def claim_reserved_workflow_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    reserved: Mapping[str, RateLimit],
) -> list[WorkflowTask]:
    """The plain claim over the unlimited queues and the ``reserved`` ones (name: the limit
    they were reserved under); the caller holds ``limit`` reserved starts of each."""
    return workflow_tasks.claim_workflow_tasks(
        conn, q, names, owner, now, lease, limit, _CLAIM_RESERVED_WORKFLOW_TASKS, _reserved_params(reserved)
    )


def claim_reserved_activity_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    reserved: Mapping[str, RateLimit],
) -> list[ActivityTask]:
    """:func:`claim_reserved_workflow_tasks` for activity tasks."""
    return activity_tasks.claim_activity_tasks(
        conn, q, names, owner, now, lease, limit, _CLAIM_RESERVED_ACTIVITY_TASKS, _reserved_params(reserved)
    )


class Reserved:
    """Starts an engine reserved on one queue (stamped ahead in its shares): how many are left
    and from when to when they may be used."""

    def __init__(self, limit: RateLimit, starts: int, since: datetime, until: datetime) -> None:
        self.limit, self.since, self.until = limit, since, until
        self._left = starts
        self._lock = threading.Lock()

    def take(self, n: int, limit: RateLimit, now: datetime) -> bool:
        """Take ``n`` of the starts left, if there are that many, the queue's limit is still the
        one they were reserved under and ``now`` is within the reservation."""
        with self._lock:
            if limit != self.limit or not queue_limits.may_start_reserved(now, self.since, self.until):
                return False
            if self._left < n:
                return False
            self._left -= n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self._left += n

    def left(self, limit: RateLimit, now: datetime) -> int:
        """The starts left that a claim under ``limit`` at ``now`` may use (0 past its reach)."""
        with self._lock:
            if limit != self.limit or not queue_limits.may_start_reserved(now, self.since, self.until):
                return 0
            return self._left


class Reservations:
    """The starts this engine reserved, per (kind, queue), for the claims of its threads.

    A claim of a kind whose every rate-limited queue (as last read) has ``limit`` reserved
    starts left takes them before its statement and gives back what it did not use; the
    plain claim's statement then claims those queues too. Otherwise the claim goes through
    the shares. A claim that fills its batch reserves more of the queues running low, if the
    limits of all the kind's queues allow it (queue_limits.reservation), before they run out:
    the claims of a busy engine then need no slot work."""

    def __init__(self) -> None:
        # per (kind, queue), the reservations held, newest last (a few: threads that found
        # the last one short at once each reserve; none is let go while it has starts left)
        self._held: dict[tuple[str, str], list[Reserved]] = {}
        self._reserving: set[tuple[str, str]] = set()  # queues a thread is reserving for now
        self._busy: dict[tuple[str, str], datetime] = {}  # the reach of the last whole reservation
        self._lock = threading.Lock()

    def _take_one(self, kind: str, name: str, limit: RateLimit, n: int, now: datetime) -> Reserved | None:
        with self._lock:
            held = list(self._held.get((kind, name), ()))
        for reserved in held:
            if reserved.take(n, limit, now):
                return reserved
        return None

    def take(self, kind: str, limited: Mapping[str, RateLimit], n: int, now: datetime) -> dict[str, Reserved] | None:
        """``n`` reserved starts of each of ``limited`` (its queues of ``kind``), or None (and
        none taken) unless every one has that many."""
        taken: dict[str, Reserved] = {}
        for name, limit in limited.items():
            reserved = self._take_one(kind, name, limit, n, now)
            if reserved is None:
                for back in taken.values():
                    back.give_back(n)
                return None
            taken[name] = reserved
        return taken

    def wanted(
        self, kind: str, limited: Mapping[str, RateLimit], n: int, now: datetime
    ) -> dict[str, tuple[int, timedelta]]:
        """What to reserve of each of ``limited`` for claims of ``n`` (queue_limits.reservation:
        how many starts, how far ahead): of those whose reservations hold fewer than
        ``RESERVE_AHEAD`` claims' worth at ``now`` and that no other thread of this engine is
        reserving for, and of those that cannot give one claim (the caller then reserves, until
        :meth:`hold`); nothing if some queue's limit allows no reservation (the claims of the
        kind then all go through the shares)."""
        sizes = {name: queue_limits.reservation(limit, n) for name, limit in limited.items()}
        wanted: dict[str, tuple[int, timedelta]] = {}
        with self._lock:
            for name, limit in limited.items():
                size = sizes[name]
                if size is None:
                    self._reserving -= {(kind, other) for other in wanted}
                    return {}
                left = sum(r.left(limit, now) for r in self._held.get((kind, name), ()))
                # one thread at a time reserves ahead; one that cannot be served reserves anyway
                if left < n or (left < RESERVE_AHEAD * n and (kind, name) not in self._reserving):
                    self._reserving.add((kind, name))
                    wanted[name] = size
        return wanted

    def hold(self, kind: str, queue: str, reserved: Reserved | None, now: datetime, busy: bool = False) -> None:
        """Keep a new reservation of the queue (None: none was made); those past their reach at
        ``now`` are let go. Ends this thread's reserving for the queue. ``busy``: it was made
        for claims that took full batches of the queue (:meth:`busy` says so until its reach)."""
        with self._lock:
            self._reserving.discard((kind, queue))
            kept = [r for r in self._held.get((kind, queue), ()) if r.until >= now]
            self._held[(kind, queue)] = [*kept, reserved] if reserved is not None else kept
            if busy and reserved is not None:
                self._busy[(kind, queue)] = reserved.until

    def busy(self, kind: str, queue: str, now: datetime) -> bool:
        """Whether a reservation made for full batches of the queue is still within its reach."""
        with self._lock:
            until = self._busy.get((kind, queue))
        return until is not None and now <= until


class Claimed(Protocol):
    @property
    def queue(self) -> str: ...


T = TypeVar("T", bound=Claimed)


def claim_with_limits(
    conn: psycopg.Connection,
    q: Statements,
    reservations: Reservations,
    kind: str,
    limited: Mapping[str, RateLimit],
    now: datetime,
    limit: int,
    through_reserved: Callable[[Mapping[str, RateLimit]], list[T]],
    through_shares: Callable[[], list[T]],
) -> list[T]:
    """A claim of up to ``limit`` tasks of ``kind``, whose rate-limited queues are ``limited``:
    with reserved starts of each when this engine holds them or reserves them now (the plain
    claim's statement, no slot work), else through the shares; a claim that fills its batch
    then reserves for the queues running low (:func:`reserve`). A failed reservation is logged: the tasks
    claimed are returned (their leases are taken)."""
    taken = reservations.take(kind, limited, limit, now)
    if taken is None and reserve(conn, q, reservations, kind, limited, now, limit, Counter()):
        taken = reservations.take(kind, limited, limit, now)
    if taken is None:
        claimed = through_shares()
    else:
        claimed = []
        try:
            claimed = through_reserved(limited)
        finally:
            used = Counter(task.queue for task in claimed)
            for name, reserved in taken.items():
                reserved.give_back(limit - used[name])
    if len(claimed) == limit:
        reserve(conn, q, reservations, kind, limited, now, limit, Counter(task.queue for task in claimed))
    return claimed


def reserve(
    conn: psycopg.Connection,
    q: Statements,
    reservations: Reservations,
    kind: str,
    limited: Mapping[str, RateLimit],
    now: datetime,
    limit: int,
    took: Counter[str],
) -> bool:
    """Reserve starts of the queues that run low (:meth:`Reservations.wanted`): before a claim
    that finds none reserved, and after one that filled its batch, before they run out.
    A queue the claim took tasks of (``took``), or that had a whole reservation within its
    reach (busy here), gets a whole reservation; one it took none of (idle here, or left to
    other engines), a batch's worth: enough for the next claim to need no slot work, little to
    lose if this engine starts nothing of it. A failed
    reservation is logged (the claims go through the shares). Whether any was made."""
    wanted = reservations.wanted(kind, limited, limit, now)
    held: set[str] = set()
    made = False
    try:
        for name, (size, reach) in wanted.items():
            got = None
            whole = took[name] > 0 or reservations.busy(kind, name, now)
            try:
                got = reserve_starts(conn, q, kind, name, limited[name], (size if whole else limit, reach), now)
            except psycopg.Error:
                log.warning(
                    "could not reserve starts of queue %r; its claims go through its slots", name, exc_info=True
                )
            reservations.hold(kind, name, got, now, busy=whole)
            held.add(name)
            made = made or got is not None
    finally:  # whatever happened, no queue is left marked as being reserved for
        for name in wanted.keys() - held:
            reservations.hold(kind, name, None, now)
    return made


Limited = dict[str, dict[str, RateLimit]]  # kind -> queue name -> its rate limit


def limited_queues(conn: psycopg.Connection, q: Statements) -> Limited:
    """The queues with a rate limit that the operator has not paused, per kind ("workflow",
    "activity"), with their limits. (A paused one is claimed by nobody; the claims of its kind
    need no reservation of it.)"""
    rows = conn.execute(
        q(
            "SELECT kind, name, rate_count, rate_period_us FROM {s}.queues"
            " WHERE rate_count IS NOT NULL AND NOT operator_paused"
        )
    ).fetchall()
    limited: Limited = {}
    for kind, name, count, period in rows:
        limited.setdefault(kind, {})[name] = RateLimit(count, timedelta(microseconds=period))
    return limited


def read_limited_queues(db: Database, q: Statements) -> Limited:
    """:func:`limited_queues`, in a statement of its own."""
    with db.statement() as conn:
        return limited_queues(conn, q)


class LimitedQueues:
    """The queues of a kind that have a rate limit, as last read (at most ``ttl`` seconds ago,
    and at once after this engine changed a queue's limit): so that an engine without limited
    queues never sends the limited claims."""

    def __init__(self, read: Callable[[], Limited], ttl: float = 1.0) -> None:
        self._read, self._ttl = read, ttl
        self._limited: Limited = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()  # the workers' threads ask at once: one read when stale

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = float("-inf")

    def of_kind(self, kind: str) -> dict[str, RateLimit]:
        """The queues of ``kind`` with a rate limit and their limits, as last read (empty: none).
        A failed read keeps what was known (the claims meet the store's fault themselves) and
        is tried again after ``ttl``."""
        with self._lock:
            if time.monotonic() - self._read_at >= self._ttl:
                try:
                    self._limited = self._read()
                except Exception:
                    log.info("could not read which queues have rate limits; kept what was known", exc_info=True)
                self._read_at = time.monotonic()
            return self._limited.get(kind, {})
