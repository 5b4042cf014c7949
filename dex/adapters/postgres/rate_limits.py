"""Claims when some queue of the kind has a rate limit: each task of a limited queue started
takes a free start slot, in the same statement as the claim.

A queue with a rate limit keeps its start slots in shares (migration 19,
``queue_limits.share_sizes``): a row per share with its slots' last starts as pairs (a moment,
how many slots last started then). One statement claims from every queue of the kind that the
operator has not paused: from an unlimited queue up to the claim's limit, as the plain claim
does; from a limited one up to the free slots of the shares it locked, a few per queue
(``queue_limits.shares_to_take``), soonest free first, ``FOR UPDATE SKIP LOCKED``: a
concurrent claim takes other shares and waits for none, so the limit holds across every engine
without a row that all of them update. The best tasks overall up to the limit are taken under
a lease, and each share whose slots they used gets one pair (the claim's time, how many),
dropping the pairs a period old (``queue_limits.in_use``: those slots are free) and saying when
its first slot is free again (``queue_limits.free_from``). Shares locked but not used are only
held until the statement commits.

The plain claims (:mod:`.workflow_tasks`, :mod:`.activity_tasks`) keep their statements and
their plans: they skip every queue whose generated ``paused`` is true, which a rate limit makes
it (migration 15). So this statement replaces them only when this engine knows of a limited
queue of the kind (:class:`LimitedQueues`: read at most every second); a limit set elsewhere is
honoured at once (the plain claims skip the queue), and its tasks are claimed here within that
second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

import psycopg

from dex.adapters.postgres import attempts
from dex.adapters.postgres.activity_tasks import claimed_activity_tasks
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.rows import ACTIVITY_TASK_COLUMNS, WORKFLOW_TASK_COLUMNS, workflow_task
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import ActivityTask, WorkflowTask

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
    """Claim up to ``limit`` activity tasks of every queue the operator has not paused, each
    task of a rate-limited queue through a free start slot."""
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
