"""The outbox of the event-driven dispatch mode (``Engine(dispatch="kafka")``, migration 17).

In that mode a trigger on each task table writes a notice row for every task made claimable,
in the transaction that made it; the leader's relay reads the outbox in ``id`` order, publishes
it and deletes what the broker acknowledged; the engines claim the tasks the notices they
receive name. This module is the SQL of all that: the switch of the triggers, the relay's read
and delete, and the claims by task id.

The triggers exist only while the database is in that mode. A database that never used it has
none, so its task inserts run exactly as before; an engine started with ``dispatch="polling"``
drops them (and the notices nobody will relay: the tasks they name are found by polling).
Creating or dropping a trigger on a partitioned table takes a lock on the table and each
partition, so the switch is made once, at an engine's start, and only when it changes anything.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from dex.adapters.postgres import attempts
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.rows import ACTIVITY_TASK_COLUMNS, WORKFLOW_TASK_COLUMNS, activity_task, workflow_task
from dex.adapters.postgres.schema import Statements
from dex.app.ports.notices import KAFKA, NoticeClaims, TaskNotice
from dex.app.ports.store import ActivityTask, WorkflowTask

T = TypeVar("T", WorkflowTask, ActivityTask)

# (table, trigger, when it fires): an activity task is announced when it becomes claimable
_TRIGGERS = (
    (
        "workflow_tasks",
        "dex_outbox",
        "AFTER INSERT ON {s}.workflow_tasks FOR EACH ROW EXECUTE FUNCTION {s}.outbox_workflow_task()",
    ),
    (
        "activity_tasks",
        "dex_outbox",
        "AFTER INSERT ON {s}.activity_tasks FOR EACH ROW WHEN (NEW.state = 'QUEUED')"
        " EXECUTE FUNCTION {s}.outbox_activity_task()",
    ),
    (
        "activity_tasks",
        "dex_outbox_queued",
        "AFTER UPDATE OF state ON {s}.activity_tasks FOR EACH ROW"
        " WHEN (OLD.state <> 'QUEUED' AND NEW.state = 'QUEUED') EXECUTE FUNCTION {s}.outbox_activity_task()",
    ),
)

# the notices (queue, task_id) of a batch, as a relation
_NOTICED = "unnest(%(queues)b::text[], %(ids)b::bigint[]) AS n(queue, task_id)"

_CLAIM_WORKFLOWS = (
    """
    WITH claimable AS (
        SELECT t.queue, t.task_id FROM {s}.workflow_tasks t JOIN """
    + _NOTICED
    + """ ON t.queue = n.queue AND t.task_id = n.task_id
        WHERE t.workflow_name = ANY(%(names)b::text[])
          AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
          AND t.queue IN (SELECT name FROM {s}.queues WHERE kind = 'workflow' AND NOT paused)
        ORDER BY t.priority DESC, t.task_id
        LIMIT %(limit)s
        FOR UPDATE OF t SKIP LOCKED
    )
    UPDATE {s}.workflow_tasks t
    SET locked_by = %(owner)s, locked_until = %(until)s, lock_version = t.lock_version + 1
    FROM claimable c WHERE t.queue = c.queue AND t.task_id = c.task_id
    RETURNING """
    + ", ".join(f"t.{column.strip()}" for column in WORKFLOW_TASK_COLUMNS.split(","))
)

# the ordinary activity claim (activity_tasks.send_activity_claim) among the noticed tasks only
_CLAIM_ACTIVITIES = (
    """
    WITH claimable AS (
        SELECT t.queue, t.task_id, t.run_id, t.created_seq, t.attempt, t.locked_by, t.locked_until
        FROM {s}.activity_tasks t JOIN """
    + _NOTICED
    + """ ON t.queue = n.queue AND t.task_id = n.task_id
        WHERE t.state = 'QUEUED' AND t.name = ANY(%(names)b::text[])
          AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
          AND t.queue IN (SELECT name FROM {s}.queues WHERE kind = 'activity' AND NOT paused)
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

# of the notices that claimed nothing, those whose task is still there: another worker held it
# (its lease, or a row lock the claim's SKIP LOCKED passed over) or the claim had no room left
# for it; the others were stale (the task done, or taken and retried as a new attempt)
_HELD = "SELECT count(*) FROM {s}.{table} t JOIN " + _NOTICED + " ON t.queue = n.queue AND t.task_id = n.task_id"

# The relay's batch, oldest first, each with whether its task is still waiting for a claim:
# a notice whose task is gone or already held (a completion claimed it in its own
# transaction: eager dispatch) is deleted without being published.
_BATCH = (
    "SELECT o.id, o.kind, o.queue, o.task_id, o.run_id, o.name, o.created_at,"
    " CASE o.kind WHEN 'workflow' THEN EXISTS ("
    "  SELECT 1 FROM {s}.workflow_tasks t WHERE t.queue = o.queue AND t.task_id = o.task_id"
    "  AND (t.locked_until IS NULL OR t.locked_until <= %(now)s))"
    " ELSE EXISTS ("
    "  SELECT 1 FROM {s}.activity_tasks t WHERE t.queue = o.queue AND t.task_id = o.task_id"
    "  AND t.state = 'QUEUED' AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)) END AS waiting"
    " FROM {s}.outbox o ORDER BY o.id LIMIT %(limit)s"
)


class PostgresOutbox:
    """The outbox and the claims by notice of one adapter's schema (module docstring)."""

    def __init__(self, db: Database, q: Statements) -> None:
        self._db, self._q = db, q

    def set_dispatch(self, mode: str) -> None:
        """Create the triggers (``"kafka"``) or drop them and the unrelayed notices (any other
        mode), in one transaction, only if that changes anything."""
        q = self._q
        with self._db.transaction() as conn:
            rows = conn.execute(
                "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND NOT t.tgisinternal AND t.tgname LIKE 'dex\\_outbox%%'"
                " AND c.relname IN ('workflow_tasks', 'activity_tasks')",
                [q.schema],
            ).fetchall()
            present = {(table, name) for table, name in rows}
            wanted = {(table, name) for table, name, _ in _TRIGGERS}
            if mode == KAFKA:
                for table, name, definition in _TRIGGERS:
                    if (table, name) not in present:
                        conn.execute(q.composed(f"CREATE TRIGGER {name} " + definition))
                return
            for table, name in sorted(present & wanted):
                conn.execute(q.composed(f"DROP TRIGGER IF EXISTS {name} ON {{s}}.{table}"))
            if present:
                conn.execute(q("DELETE FROM {s}.outbox"))

    def batch(self, now: datetime, limit: int) -> list[tuple[TaskNotice, int, bool]]:
        """The oldest ``limit`` notices, each with its row id and whether its task waits for a claim."""
        with self._db.statement() as conn:
            rows = conn.execute(self._q(_BATCH), {"now": now, "limit": limit}).fetchall()
        return [
            (
                TaskNotice(kind=kind, queue=queue, task_id=task_id, run_id=run_id, name=name, created_at=created_at),
                row_id,
                waiting,
            )
            for row_id, kind, queue, task_id, run_id, name, created_at, waiting in rows
        ]

    def delete(self, row_ids: Sequence[int]) -> None:
        if not row_ids:
            return
        with self._db.statement() as conn:
            conn.execute(self._q("DELETE FROM {s}.outbox WHERE id = ANY(%b::bigint[])"), [sorted(row_ids)])

    def depth(self, now: datetime) -> tuple[int, float]:
        """How many notices wait in the outbox, and the age in seconds of the oldest."""
        with self._db.statement() as conn:
            row = conn.execute(self._q("SELECT count(*), min(created_at) FROM {s}.outbox")).fetchone()
        count, oldest = row if row is not None else (0, None)
        return int(count), max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0

    def claim_workflow_tasks(
        self,
        notices: Sequence[TaskNotice],
        names: Collection[str],
        owner: str,
        now: datetime,
        lease: timedelta,
        limit: int,
    ) -> NoticeClaims[WorkflowTask]:
        params = self._params(notices, names, now, limit) | {"owner": owner, "until": now + lease}
        rows = self._claim(_CLAIM_WORKFLOWS, params) if params["ids"] else []
        tasks = sorted((workflow_task(row) for row in rows), key=lambda task: task.task_id)
        return self._claims(tuple(tasks), notices, "workflow_tasks")

    def claim_activity_tasks(
        self,
        notices: Sequence[TaskNotice],
        names: Collection[str],
        owner: str,
        now: datetime,
        lease: timedelta,
        limit: int,
    ) -> NoticeClaims[ActivityTask]:
        params = self._params(notices, names, now, limit) | {"owner": owner, "lease": lease}
        rows = self._claim(_CLAIM_ACTIVITIES, params) if params["ids"] else []
        tasks = sorted((activity_task(row) for row in rows), key=lambda task: task.task_id)
        return self._claims(tuple(tasks), notices, "activity_tasks")

    def _params(
        self, notices: Sequence[TaskNotice], names: Collection[str], now: datetime, limit: int
    ) -> dict[str, Any]:
        keys = sorted({(notice.queue, notice.task_id) for notice in notices})
        return {
            "queues": [queue for queue, _ in keys],
            "ids": [task_id for _, task_id in keys],
            "names": sorted(names),
            "now": now,
            "limit": max(0, limit),
        }

    def _claim(self, statement: str, params: dict[str, Any]) -> list[Any]:
        with self._db.statement() as conn:
            return conn.execute(self._q(statement), params).fetchall()

    def _claims(self, tasks: tuple[T, ...], notices: Sequence[TaskNotice], table: str) -> NoticeClaims[T]:
        taken = {(task.queue, task.task_id) for task in tasks}
        missed = sorted({(n.queue, n.task_id) for n in notices} - taken)
        conflicts = 0
        if missed:  # a rare second statement, only for notices that claimed nothing
            with self._db.statement() as conn:
                row = conn.execute(
                    self._q(_HELD.replace("{table}", table)),
                    {"queues": [queue for queue, _ in missed], "ids": [task_id for _, task_id in missed]},
                ).fetchone()
            conflicts = int(row[0]) if row is not None else 0
        distinct = len({(n.queue, n.task_id) for n in notices})
        stale = len(notices) - distinct + len(missed) - conflicts  # duplicates in the batch are stale too
        return NoticeClaims(tasks=tasks, conflicts=conflicts, stale=stale)
