"""Queue administration, the leadership lease and the due-time query.

:class:`PostgresQueues` is the adapter's part that runs them, and keeps the set of queues known
to exist, so that a start or a completion creates a queue's row and partition (DDL, in a
transaction of its own) only the first time it uses the queue.

A queue is a row of ``queues`` plus a partition of its kind's task table. The partition is
created in the same transaction that inserts the row, and only by the transaction whose
insert succeeded: a concurrent creator waits on the uncommitted row, finds the conflict and
does no DDL, so the ACCESS EXCLUSIVE lock that ``CREATE TABLE .. PARTITION OF`` takes on the
parent is taken once per queue, not on every ``ensure_queue``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime, timedelta

import psycopg

from dex.adapters.postgres.database import Database
from dex.adapters.postgres.rate_limits import LimitedQueues
from dex.adapters.postgres.schema import Statements, create_partition
from dex.app.ports.store import QUEUE_KINDS, ActivitySlots, QueueInfo, queue_capacity
from dex.domain import queue_limits as limits
from dex.domain.definitions import validate_queue
from dex.domain.queue_limits import RateLimit


def check_queue(name: str, kind: str, capacity: int) -> None:
    """ValueError unless name, kind and capacity are valid (as the in-memory adapter checks)."""
    validate_queue(name)
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    queue_capacity(capacity)


def ensure_queue(conn: psycopg.Connection, q: Statements, name: str, kind: str, capacity: int) -> None:
    """Create the queue and its partition unless the queue exists."""
    row = conn.execute(
        q("INSERT INTO {s}.queues (kind, name, capacity) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING name"),
        [kind, name, capacity],
    ).fetchone()
    if row is not None:
        create_partition(conn, q.schema, kind, name)


def create_queue(
    conn: psycopg.Connection,
    q: Statements,
    name: str,
    kind: str,
    capacity: int,
    key_concurrency: int = 1,
    rate_limit: RateLimit | None = None,
) -> None:
    """Create the queue, or give the existing one these settings."""
    row = conn.execute(
        q(
            "INSERT INTO {s}.queues AS qu (kind, name, capacity, key_concurrency, rate_count, rate_period_us)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (kind, name) DO UPDATE SET capacity = excluded.capacity,"
            " key_concurrency = excluded.key_concurrency, rate_count = excluded.rate_count,"
            " rate_period_us = excluded.rate_period_us"
            " RETURNING (xmax = 0) AS inserted"
        ),
        [kind, name, capacity, key_concurrency, *_rate_columns(rate_limit)],
    ).fetchone()
    if row is not None and row[0]:
        create_partition(conn, q.schema, kind, name)
    start_slots(conn, q, name, kind, rate_limit)


def _rate_columns(rate_limit: RateLimit | None) -> tuple[int | None, int | None]:
    """A rate limit as its columns: the count, and the period in whole microseconds."""
    if rate_limit is None:
        return None, None
    return rate_limit.starts, rate_limit.period // timedelta(microseconds=1)


def start_slots(conn: psycopg.Connection, q: Statements, name: str, kind: str, rate_limit: RateLimit | None) -> None:
    """Make the queue's start slots match its rate limit (none without one): its shares
    rewritten as ``queue_limits.regroup`` says, keeping the newest stamps up to the new count,
    so that lowering the count lets no burst through; new slots have never started anything.
    The caller has updated the queue's row, so a concurrent change of it waits; the shares
    are locked first, so a claim holding one is waited for."""
    rows = conn.execute(
        q("SELECT recent, counts FROM {s}.queue_start_shares WHERE kind = %s AND queue = %s FOR UPDATE"),
        [kind, name],
    ).fetchall()
    stamps = [stamp for recent, counts in rows for stamp in zip(recent, counts, strict=True)]
    conn.execute(q("DELETE FROM {s}.queue_start_shares WHERE kind = %s AND queue = %s"), [kind, name])
    if rate_limit is None:
        return
    sizes = limits.share_sizes(rate_limit.starts)
    shares = limits.regroup(stamps, rate_limit.starts)
    with conn.cursor() as cur:
        cur.executemany(
            q(
                "INSERT INTO {s}.queue_start_shares (kind, queue, share, slots, recent, counts, free_at)"
                " VALUES (%s, %s, %s, %s, %b::timestamptz[], %b::integer[], coalesce(%s::timestamptz, '-infinity'))"
            ),
            [
                (
                    kind,
                    name,
                    share,
                    size,
                    [last_start for last_start, _ in stamps_of],
                    [n for _, n in stamps_of],
                    limits.free_from(stamps_of, size, rate_limit.period),
                )
                for share, (size, stamps_of) in enumerate(zip(sizes, shares, strict=True))
            ],
        )


_UPDATES = {
    # the operator's pause; ``paused`` is generated from it and the rate limit (migration 15)
    "paused": "UPDATE {s}.queues SET operator_paused = %s WHERE kind = %s AND name = %s",
    "capacity": "UPDATE {s}.queues SET capacity = %s WHERE kind = %s AND name = %s",
    "key_concurrency": "UPDATE {s}.queues SET key_concurrency = %s WHERE kind = %s AND name = %s",
}


def update_queue(conn: psycopg.Connection, q: Statements, name: str, kind: str, column: str, value: object) -> None:
    """Set ``paused``, ``capacity`` or ``key_concurrency`` of an existing queue; ValueError if there is none."""
    if conn.execute(q(_UPDATES[column]), [value, kind, name]).rowcount == 0:
        raise ValueError(f"there is no {kind} queue named {name!r}")


def limit_rate(conn: psycopg.Connection, q: Statements, name: str, kind: str, rate_limit: RateLimit | None) -> None:
    """Set or remove an existing queue's rate limit, and make its start slots match it. The
    queue's row is updated first, so a second change of the same queue waits for this one."""
    updated = conn.execute(
        q("UPDATE {s}.queues SET rate_count = %s, rate_period_us = %s WHERE kind = %s AND name = %s"),
        [*_rate_columns(rate_limit), kind, name],
    )
    if updated.rowcount == 0:
        raise ValueError(f"there is no {kind} queue named {name!r}")
    start_slots(conn, q, name, kind, rate_limit)


def list_queues(conn: psycopg.Connection, q: Statements) -> list[QueueInfo]:
    rows = conn.execute(
        q(
            "SELECT q.name, q.kind, q.operator_paused, q.capacity, CASE q.kind"
            "  WHEN 'workflow' THEN (SELECT count(*) FROM {s}.workflow_tasks t WHERE t.queue = q.name)"
            "  ELSE (SELECT count(*) FROM {s}.activity_tasks t WHERE t.queue = q.name) END,"
            " q.key_concurrency, q.rate_count, q.rate_period_us"
            " FROM {s}.queues q"
        )
    ).fetchall()
    infos = [
        QueueInfo(
            name=name,
            kind=kind,
            status="PAUSED" if paused else "ACTIVE",
            capacity=capacity,
            depth=depth,
            key_concurrency=key_concurrency,
            rate_limit=RateLimit(count, timedelta(microseconds=period)) if count is not None else None,
        )
        for name, kind, paused, capacity, depth, key_concurrency, count, period in rows
    ]
    return sorted(infos, key=lambda info: (info.name, info.kind))


def activity_slots(conn: psycopg.Connection, q: Statements) -> list[ActivitySlots]:
    """Per activity queue, the slots its tasks hold: counted as the scheduler counts them
    (activity_tasks._SCHEDULE), an index scan of ``activity_tasks_claim`` in the queue's partition."""
    rows = conn.execute(
        q(
            "SELECT q.name, q.paused, q.capacity,"
            " (SELECT count(*) FROM {s}.activity_tasks t WHERE t.queue = q.name AND t.state = 'QUEUED')"
            " FROM {s}.queues q WHERE q.kind = 'activity' ORDER BY q.name"
        )
    ).fetchall()
    return [
        ActivitySlots(queue=name, paused=paused, capacity=capacity, held=held) for name, paused, capacity, held in rows
    ]


def try_lead(conn: psycopg.Connection, q: Statements, node_id: str, now: datetime, ttl: timedelta) -> bool:
    """Take the lease if it is free or expired, renew it if it is ours; True while we lead."""
    # The single row's lock serialises contenders: a second INSERT waits for the first to
    # commit, then its WHERE sees the first one's fresh lease and leaves it alone.
    row = conn.execute(
        q(
            "INSERT INTO {s}.leader AS l (singleton, node_id, lease_until) VALUES (true, %s, %s)"
            " ON CONFLICT (singleton) DO UPDATE SET node_id = excluded.node_id, lease_until = excluded.lease_until"
            " WHERE l.node_id = excluded.node_id OR l.lease_until <= %s"
            " RETURNING node_id"
        ),
        [node_id, now + ttl, now],
    ).fetchone()
    return row is not None


def release_leadership(conn: psycopg.Connection, q: Statements, node_id: str) -> None:
    conn.execute(q("DELETE FROM {s}.leader WHERE node_id = %s"), [node_id])


def next_due_time(conn: psycopg.Connection, q: Statements, now: datetime) -> datetime | None:
    """The earliest moment after ``now`` when a message, a waiting activity task or a lease
    becomes due (each branch is one index probe), or a share of a rate-limited queue that has
    tasks gets a free start slot again (no rows without rate limits)."""
    row = conn.execute(
        q(
            "SELECT least("
            " (SELECT min(visible_from) FROM {s}.inbox WHERE visible_from > %(now)s),"
            " (SELECT min(visible_from) FROM {s}.activity_tasks WHERE state = 'CREATED' AND visible_from > %(now)s),"
            " (SELECT min(locked_until) FROM {s}.activity_tasks WHERE locked_until IS NOT NULL AND locked_until > %(now)s),"
            " (SELECT min(locked_until) FROM {s}.workflow_tasks WHERE locked_until IS NOT NULL AND locked_until > %(now)s),"
            " (SELECT min(st.free_at)"
            "  FROM {s}.queues qu JOIN {s}.queue_start_shares st ON st.kind = qu.kind AND st.queue = qu.name"
            "  WHERE qu.rate_count IS NOT NULL AND st.free_at > %(now)s"
            "    AND CASE qu.kind WHEN 'workflow'"
            "      THEN EXISTS (SELECT 1 FROM {s}.workflow_tasks t WHERE t.queue = qu.name)"
            "      ELSE EXISTS (SELECT 1 FROM {s}.activity_tasks t WHERE t.queue = qu.name AND t.state = 'QUEUED') END))"
        ),
        {"now": now},
    ).fetchone()
    return row[0] if row is not None else None


class PostgresQueues:
    """The queue administration, leadership and due-time ports of the PostgreSQL adapter, and
    the cache of queues known to exist that its other parts consult before they write."""

    def __init__(self, db: Database, q: Statements, limited: LimitedQueues) -> None:
        self._db = db
        self._q = q
        self._limited = limited  # told when this engine changes a rate limit
        self._known: set[tuple[str, str]] = set()
        # the parts' threads (starts, flushers, scheduler) consult the cache at once
        self._known_lock = threading.Lock()

    def ensure_all(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Make sure each (name, kind) queue exists; only those not yet known cost a transaction."""
        with self._known_lock:
            missing = sorted(set(wanted) - self._known)
        for name, kind in missing:
            self.ensure_queue(name, kind)

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        check_queue(name, kind, capacity)
        with self._known_lock:
            if (name, kind) in self._known:
                return
        with self._db.transaction() as conn:
            ensure_queue(conn, self._q, name, kind, capacity)
        with self._known_lock:  # queues are never deleted, so once known, always known
            self._known.add((name, kind))

    def create_queue(
        self, name: str, kind: str, capacity: int, key_concurrency: int = 1, rate_limit: RateLimit | None = None
    ) -> None:
        check_queue(name, kind, capacity)
        n, limit = limits.key_concurrency(key_concurrency), limits.rate_limit(rate_limit)
        with self._db.transaction() as conn:
            create_queue(conn, self._q, name, kind, capacity, n, limit)
        self._limited.invalidate()
        with self._known_lock:
            self._known.add((name, kind))

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        check_queue(name, kind, 1)
        with self._db.transaction() as conn:
            update_queue(conn, self._q, name, kind, "paused", bool(paused))
        self._limited.invalidate()  # the claims of a paused limited queue's kind leave it out

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        check_queue(name, kind, capacity)
        with self._db.transaction() as conn:
            update_queue(conn, self._q, name, kind, "capacity", capacity)

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        check_queue(name, kind, 1)
        n = limits.key_concurrency(key_concurrency)
        with self._db.transaction() as conn:
            update_queue(conn, self._q, name, kind, "key_concurrency", n)

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: RateLimit | None) -> None:
        check_queue(name, kind, 1)
        limit = limits.rate_limit(rate_limit)
        with self._db.transaction() as conn:
            limit_rate(conn, self._q, name, kind, limit)
        self._limited.invalidate()

    def list_queues(self) -> list[QueueInfo]:
        with self._db.statement() as conn:
            return list_queues(conn, self._q)

    def activity_slots(self) -> list[ActivitySlots]:
        with self._db.statement() as conn:
            return activity_slots(conn, self._q)

    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        with self._db.statement() as conn:
            return try_lead(conn, self._q, node_id, now, ttl)

    def release_leadership(self, node_id: str) -> None:
        with self._db.transaction() as conn:
            release_leadership(conn, self._q, node_id)

    def next_due_time(self, now: datetime) -> datetime | None:
        with self._db.statement() as conn:
            return next_due_time(conn, self._q, now)
