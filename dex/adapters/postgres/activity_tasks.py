"""Activity tasks: make them claimable, claim them, extend and honour their leases.

A task is CREATED (waiting for ``visible_from``: a first attempt or a retry) or QUEUED
(claimable, or claimed under a lease). The scheduler moves CREATED tasks to QUEUED while the
queue has room (capacity counts QUEUED tasks); workers claim QUEUED ones.

Lock order, to keep every pair of transactions deadlock-free: ``runs`` rows first, in run id
order; then task rows, in (queue, task_id) order. Claims and the scheduler only ever skip
locked rows (``SKIP LOCKED``), so they never wait at all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from dex.adapters.postgres import attempts
from dex.adapters.postgres.rows import ACTIVITY_TASK_COLUMNS, activity_task, inbox_insert, inbox_row
from dex.adapters.postgres.schema import LIVE, LOCK_SCHEDULE_ACTIVITIES, Statements
from dex.app.ports.store import ActivityOutcome, ActivityTask

# the (queue, task_id, owner, version) of each given task, as a relation
_WANTED = "unnest(%b::text[], %b::bigint[], %b::text[], %b::integer[]) AS w(queue, task_id, owner, version)"


def _lease_arrays(tasks: Sequence[ActivityTask]) -> list[list[object]]:
    return [
        [t.queue for t in tasks],
        [t.task_id for t in tasks],
        [t.lease.owner for t in tasks],
        [t.lease.version for t in tasks],
    ]


# Per active queue, the best visible CREATED tasks up to its free slots (an index scan of
# activity_tasks_waiting in each partition), then the best of those overall. The operator's
# pause stops scheduling; a rate limit does not (it limits the claims: migration 15). SKIP LOCKED
# passes over tasks being deleted by a run's completion. GATE is where a dispatch adds its
# condition (dispatch.dispatch_now).
_SCHEDULE = """
    WITH free AS (
        SELECT q.name AS queue,
               q.capacity - (SELECT count(*) FROM {s}.activity_tasks t
                             WHERE t.queue = q.name AND t.state = 'QUEUED') AS slots
        FROM {s}.queues q WHERE q.kind = 'activity' AND NOT q.operator_paused GATE
    ),
    chosen AS (
        SELECT w.queue, w.task_id FROM free f
        CROSS JOIN LATERAL (
            SELECT t.queue, t.task_id, t.priority FROM {s}.activity_tasks t
            WHERE t.queue = f.queue AND t.state = 'CREATED' AND t.visible_from <= %(now)s
            ORDER BY t.priority DESC, t.task_id
            LIMIT greatest(least(f.slots, %(limit)s), 0)
            FOR UPDATE OF t SKIP LOCKED
        ) w
        ORDER BY w.priority DESC, w.task_id
        LIMIT %(limit)s
    )
    UPDATE {s}.activity_tasks t SET state = 'QUEUED'
    FROM chosen c WHERE t.queue = c.queue AND t.task_id = c.task_id
"""
_SCHEDULE_UNDER_LOCK = _SCHEDULE.replace("GATE", "")
_SCHEDULE_IF_LOCKED = _SCHEDULE.replace("GATE", "AND current_setting(%(gate)s, true) = 'true'")


# The claim (see send_activity_claim). CLAIMED_QUEUES is the queues it takes from
# (rate_limits.py claims reserved rate-limited queues with the same statement).
CLAIMED_QUEUES = "t.queue IN (SELECT name FROM {s}.queues WHERE kind = 'activity' AND NOT paused)"
CLAIM = (
    """
    WITH claimable AS (
        SELECT t.queue, t.task_id, t.run_id, t.created_seq, t.attempt, t.locked_by, t.locked_until
        FROM {s}.activity_tasks t
        WHERE t.state = 'QUEUED' AND t.name = ANY(%(names)b::text[])
          AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
          AND """
    + CLAIMED_QUEUES
    + """
        ORDER BY t.priority DESC, t.task_id
        LIMIT %(limit)s
        FOR UPDATE OF t SKIP LOCKED
    ), claimed AS (
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


def schedule_activity_tasks(conn: psycopg.Connection, q: Statements, now: datetime, limit: int) -> int:
    if limit <= 0:
        return 0
    # serialises schedulers, so two of them cannot both fill the same free slots
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_SCHEDULE_ACTIVITIES, q.schema])
    moved = conn.execute(q(_SCHEDULE_UNDER_LOCK), {"now": now, "limit": limit})
    return moved.rowcount


def dispatch_activity_tasks(conn: psycopg.Connection, q: Statements, now: datetime, limit: int, gate: str) -> None:
    """The scheduler's statement, made only if this transaction took the scheduler's lock:
    ``gate`` names the transaction's setting that says so (see dispatch.dispatch_now). The
    row count is not read, so in a pipeline the statement costs no round trip."""
    conn.execute(
        q(_SCHEDULE_IF_LOCKED),
        {"now": now, "limit": limit, "gate": gate},
    )


def claim_activity_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    statement: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> list[ActivityTask]:
    """Claim up to ``limit`` tasks, best first (``statement``, ``extra``: see :func:`send_activity_claim`)."""
    return claimed_activity_tasks(send_activity_claim(conn, q, names, owner, now, lease, limit, statement, extra))


def claimed_activity_tasks(sent: psycopg.Cursor[Any] | None) -> list[ActivityTask]:
    """The tasks a claim sent by :func:`send_activity_claim` took, best first."""
    if sent is None:
        return []
    rows = sent.fetchall()
    rows.sort(key=lambda row: (-row[6], row[0]))
    return [activity_task(row) for row in rows]


def send_activity_claim(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    statement: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> psycopg.Cursor[Any] | None:
    """Send a claim; its rows are read by :func:`claimed_activity_tasks` (in a pipeline, after
    the commit: the claim then costs no round trip of its own). None if nothing can be claimed.
    ``statement`` and ``extra`` (its further parameters) are the rate limits' variants of
    :data:`CLAIM` (rate_limits.py)."""
    if not names or limit <= 0:
        return None
    # as for workflow tasks: SKIP LOCKED, a lease until now + the short lease (at most the
    # task's lock_timeout; the engine extends it while the attempt runs), and a new
    # lock_version; a task taken over from an expired lease counts as a new attempt, and the
    # attempt it lost is kept (attempts.LOST_FROM_CLAIM: no row is written for any other claim)
    params = {"names": sorted(names), "now": now, "lease": lease, "limit": limit, "owner": owner}
    return conn.execute(q(statement or CLAIM), {**params, **extra} if extra else params)


def extend_activity_leases(
    conn: psycopg.Connection, q: Statements, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta
) -> list[bool]:
    if not tasks:
        return []
    # the CTE locks the rows in (queue, task_id) order before the UPDATE touches them, the same
    # order a completion locks them in; the lease condition is re-checked after any wait
    rows = conn.execute(
        q(
            "WITH held AS ("
            " SELECT t.queue, t.task_id FROM {s}.activity_tasks t JOIN "
            + _WANTED
            + "  ON t.queue = w.queue AND t.task_id = w.task_id"
            " WHERE t.locked_by = w.owner AND t.lock_version = w.version"
            " ORDER BY t.queue, t.task_id FOR UPDATE OF t)"
            " UPDATE {s}.activity_tasks t SET locked_until = %s + least(t.lock_timeout, %s)"
            " FROM held h WHERE t.queue = h.queue AND t.task_id = h.task_id"
            " RETURNING t.task_id"
        ),
        [*_lease_arrays(tasks), now, lease],
    ).fetchall()
    extended = {row[0] for row in rows}
    return [task.task_id in extended for task in tasks]


def complete_activity_tasks(
    conn: psycopg.Connection, q: Statements, outcomes: Sequence[ActivityOutcome], now: datetime
) -> list[bool]:
    """Write ``outcomes`` (retries among them) in the caller's transaction: which applied. Both
    reads go out before either answer is read (one round trip in a pipeline)."""
    if not outcomes:
        return []
    live, leases = (conn.execute(query, params) for query, params in completion_reads(q, outcomes))
    applied, writes = completion_writes(q, outcomes, live.fetchall(), leases.fetchall(), now)
    for query, params in writes:
        conn.execute(query, params)
    return applied


Statement = tuple[Any, list[Any]]  # a query and its parameters


def completion_reads(q: Statements, outcomes: Sequence[ActivityOutcome]) -> tuple[Statement, Statement]:
    """The two reads that a completion of ``outcomes`` decides on, in this order:

    1. the runs that receive a message, FOR SHARE and in order: a run that a concurrent
       workflow task is ending makes us wait, and then it is no longer live (message dropped);
    2. the task rows, FOR UPDATE in (queue, task_id) order, with their current lease.

    The synchronous path (:func:`complete_activity_tasks`) and an ``async def`` transaction step
    (transactions.py) send the same statements."""
    tasks = [outcome.task for outcome in outcomes]
    live = (
        q(
            "SELECT run_id FROM {s}.runs WHERE run_id = ANY(%b::text[]) AND status IN "
            + LIVE
            + " ORDER BY run_id FOR SHARE"
        ),
        [sorted({task.run_id for task in tasks})],
    )
    leases = (
        q(
            "SELECT t.queue, t.task_id, t.locked_by, t.lock_version FROM {s}.activity_tasks t"
            " WHERE (t.queue, t.task_id) IN (SELECT w.queue, w.task_id FROM " + _WANTED + ")"
            " ORDER BY t.queue, t.task_id FOR UPDATE OF t"
        ),
        _lease_arrays(tasks),
    )
    return live, leases


def completion_writes(
    q: Statements,
    outcomes: Sequence[ActivityOutcome],
    live_rows: Sequence[Any],
    lease_rows: Sequence[Any],
    now: datetime,
) -> tuple[list[bool], list[Statement]]:
    """Which outcomes apply, given the answers of :func:`completion_reads`, and the statements
    that write them: an outcome whose lease was lost applies nothing."""
    live_runs = {row[0] for row in live_rows}
    leases = {(queue, task_id): (owner, version) for queue, task_id, owner, version in lease_rows}
    applied: list[bool] = []
    retries: list[ActivityOutcome] = []
    finished: list[ActivityOutcome] = []
    for outcome in outcomes:
        key = (outcome.task.queue, outcome.task.task_id)
        if leases.get(key) != (outcome.task.lease.owner, outcome.task.lease.version):
            applied.append(False)  # the lease was lost: another worker owns (or finished) this task
            continue
        del leases[key]  # the lease is used up: a second outcome for this attempt finds it gone
        (retries if outcome.retry_at is not None else finished).append(outcome)
        applied.append(True)
    writes: list[Statement] = []
    if retries:
        writes.append(
            (
                q(
                    "UPDATE {s}.activity_tasks t"
                    " SET state = 'CREATED', visible_from = r.retry_at, attempt = t.attempt + r.counts,"
                    "     locked_by = NULL, locked_until = NULL"
                    " FROM unnest(%b::text[], %b::bigint[], %b::timestamptz[], %b::int[])"
                    "   AS r(queue, task_id, retry_at, counts)"
                    " WHERE t.queue = r.queue AND t.task_id = r.task_id"
                ),
                [
                    [o.task.queue for o in retries],
                    [o.task.task_id for o in retries],
                    [o.retry_at for o in retries],
                    [int(o.counts) for o in retries],  # a retry the machinery caused is the same attempt
                ],
            )
        )
        failures = attempts.record_failures(q, retries, now)  # the failed attempts, kept with their retry
        if failures is not None:
            writes.append(failures)
    if finished:
        writes.append(
            (
                q(
                    "DELETE FROM {s}.activity_tasks t USING unnest(%b::text[], %b::bigint[]) AS d(queue, task_id)"
                    " WHERE t.queue = d.queue AND t.task_id = d.task_id"
                ),
                [[o.task.queue for o in finished], [o.task.task_id for o in finished]],
            )
        )
        messages = []
        for outcome in finished:
            message = outcome.message
            assert message is not None
            if outcome.task.run_id in live_runs:  # a finished or deleted run gets nothing
                messages.append(inbox_row(outcome.task.run_id, message, now))
        inserting = inbox_insert(q, messages)
        if inserting is not None:
            writes.append(inserting)
    return applied, writes


def find_activity_tasks(conn: psycopg.Connection, q: Statements, task_ids: Sequence[int]) -> list[ActivityTask | None]:
    if not task_ids:
        return []
    # by task id alone (a remote worker knows no queue, the primary key's first column): the
    # partitions' live rows are scanned; an index on task_id would make it a lookup
    rows = conn.execute(
        q(
            "SELECT " + ACTIVITY_TASK_COLUMNS + " FROM {s}.activity_tasks"
            " WHERE task_id = ANY(%b::bigint[]) AND state = 'QUEUED' AND locked_by IS NOT NULL"
        ),
        [list(task_ids)],
    ).fetchall()
    found = {row[0]: activity_task(row) for row in rows}
    return [found.get(task_id) for task_id in task_ids]
