"""Claims from rate-limited queues: each task started takes one of its queue's start slots.

A queue with a rate limit of ``count`` per ``period`` has ``count`` rows in ``queue_starts``
(migration 15). A claim here takes, per limited queue, the slots whose last start is at least
a period old (``queue_limits.slot_is_free``: ``last_start <= now - period``), then as many of
the queue's claimable tasks as it found free slots, pairs them one to one, stamps each slot
used with the claim's time and takes each task under a lease, in one statement. Both reads
skip locked rows (``FOR UPDATE SKIP LOCKED``): a concurrent claim takes other slots and other
tasks, and waits for none, so the limit holds across every engine without a row that all of
them update. Slots locked but not used (more free slots than tasks) are only held until the
statement commits.

The plain claims (:mod:`.workflow_tasks`, :mod:`.activity_tasks`) keep their statements and
their plans: they skip every queue whose generated ``paused`` is true, which a rate limit
makes it. So these statements are sent only when this engine knows of a limited queue
(:class:`LimitedQueues`: read at most every second); a limit set elsewhere is honoured at once
(the plain claims skip the queue), and its tasks are claimed here within that second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import TypeVar

import psycopg

from dex.adapters.postgres import attempts
from dex.adapters.postgres.activity_tasks import claimed_activity_tasks
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.rows import ACTIVITY_TASK_COLUMNS, WORKFLOW_TASK_COLUMNS, workflow_task
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import ActivityTask, WorkflowTask

log = logging.getLogger("dex.worker")
T = TypeVar("T")

# Per limited queue of the kind (not paused by the operator), its free slots, oldest first,
# numbered 1.. per queue. KIND is filled in below.
_FREE_SLOTS = """
    WITH limited AS (
        SELECT qu.name, qu.rate_period_us FROM {s}.queues qu
        WHERE qu.kind = 'KIND' AND qu.rate_count IS NOT NULL AND NOT qu.operator_paused
    ),
    slots AS (
        SELECT f.queue, f.slot, row_number() OVER (PARTITION BY f.queue ORDER BY f.last_start, f.slot) AS n
        FROM limited l CROSS JOIN LATERAL (
            SELECT st.queue, st.slot, st.last_start FROM {s}.queue_starts st
            WHERE st.kind = 'KIND' AND st.queue = l.name
              AND st.last_start <= %(now)s - l.rate_period_us * interval '1 microsecond'
            ORDER BY st.last_start
            LIMIT %(limit)s
            FOR UPDATE OF st SKIP LOCKED
        ) f
    ),
    free AS (SELECT s.queue, count(*) AS n FROM slots s GROUP BY s.queue),
"""

# Per queue, its best claimable tasks up to its free slots, paired with the slots (n-th task,
# n-th slot), the best overall up to the claim's limit; then the slots used are stamped.
_PAIRED = """
    chosen AS (
        SELECT w.*, s.slot FROM (
            SELECT w.*, row_number() OVER (PARTITION BY w.queue ORDER BY w.priority DESC, w.task_id) AS n
            FROM free f CROSS JOIN LATERAL (TASKS) w
        ) w JOIN slots s ON s.queue = w.queue AND s.n = w.n
        ORDER BY w.priority DESC, w.task_id
        LIMIT %(limit)s
    ),
    started AS (
        UPDATE {s}.queue_starts st SET last_start = %(now)s
        FROM chosen c WHERE st.kind = 'KIND' AND st.queue = c.queue AND st.slot = c.slot
    ),
"""

_WORKFLOW_TASKS = """
    SELECT t.queue, t.task_id, t.priority FROM {s}.workflow_tasks t
    WHERE t.queue = f.queue AND t.workflow_name = ANY(%(names)b::text[])
      AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
    ORDER BY t.priority DESC, t.task_id
    LIMIT f.n
    FOR UPDATE OF t SKIP LOCKED
"""

_CLAIM_WORKFLOW_TASKS = (
    (_FREE_SLOTS + _PAIRED).replace("KIND", "workflow").replace("TASKS", _WORKFLOW_TASKS)
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
    WHERE t.queue = f.queue AND t.state = 'QUEUED' AND t.name = ANY(%(names)b::text[])
      AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
    ORDER BY t.priority DESC, t.task_id
    LIMIT f.n
    FOR UPDATE OF t SKIP LOCKED
"""

# as the plain claim (activity_tasks.send_activity_claim): a task taken over from an expired
# lease counts as a new attempt, and the attempt it lost is kept (``claimable`` is the name
# attempts.LOST_FROM_CLAIM reads)
_CLAIM_ACTIVITY_TASKS = (
    (_FREE_SLOTS + _PAIRED).replace("KIND", "activity").replace("TASKS", _ACTIVITY_TASKS)
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
    """Claim up to ``limit`` workflow tasks of rate-limited queues, each through a free start slot."""
    if not names or limit <= 0:
        return []
    rows = conn.execute(
        q(_CLAIM_WORKFLOW_TASKS),
        {"names": sorted(names), "now": now, "limit": limit, "owner": owner, "until": now + lease},
    ).fetchall()
    rows.sort(key=lambda row: (-row[4], row[0]))
    return [workflow_task(row) for row in rows]


def claim_activity_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> list[ActivityTask]:
    """Claim up to ``limit`` activity tasks of rate-limited queues, each through a free start slot."""
    if not names or limit <= 0:
        return []
    sent = conn.execute(
        q(_CLAIM_ACTIVITY_TASKS),
        {"names": sorted(names), "now": now, "lease": lease, "limit": limit, "owner": owner},
    )
    return claimed_activity_tasks(sent)


def limited_kinds(conn: psycopg.Connection, q: Statements) -> frozenset[str]:
    """The kinds of queue ("workflow", "activity") of which some queue has a rate limit."""
    rows = conn.execute(q("SELECT DISTINCT kind FROM {s}.queues WHERE rate_count IS NOT NULL")).fetchall()
    return frozenset(row[0] for row in rows)


def read_limited_kinds(db: Database, q: Statements) -> frozenset[str]:
    """:func:`limited_kinds`, in a statement of its own."""
    with db.statement() as conn:
        return limited_kinds(conn, q)


class LimitedQueues:
    """Whether some queue of a kind has a rate limit, as last read (at most ``ttl`` seconds
    ago, and at once after this engine changed a queue's limit): so that an engine without
    limited queues never sends the limited claims."""

    def __init__(self, read: Callable[[], frozenset[str]], ttl: float = 1.0) -> None:
        self._read, self._ttl = read, ttl
        self._kinds: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._lock = threading.Lock()  # the workers' threads ask at once: one read when stale

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = float("-inf")

    def any_of(self, kind: str) -> bool:
        """Whether some queue of ``kind`` has a rate limit, as last read. A failed read keeps
        what was known (the claims meet the store's fault themselves) and is tried again after
        ``ttl``."""
        with self._lock:
            if time.monotonic() - self._read_at >= self._ttl:
                try:
                    self._kinds = self._read()
                except Exception:
                    log.info("could not read which queues have rate limits; kept what was known", exc_info=True)
                self._read_at = time.monotonic()
            return kind in self._kinds


def then_limited(claimed: list[T], claim_limited: Callable[[], list[T]]) -> list[T]:
    """``claimed`` (a plain claim's tasks, already committed) and then what the limited claim
    takes. When the limited claim fails after the plain one took tasks, those are returned
    (their leases are taken: raising would leave them until their leases expire) and the
    fault is logged; with nothing claimed, the fault is the caller's, as for any claim."""
    try:
        return claimed + claim_limited()
    except psycopg.Error:
        if not claimed:
            raise
        log.warning("the claim of rate-limited queues failed; the other tasks claimed go on", exc_info=True)
        return claimed
