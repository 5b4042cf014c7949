"""The dashboard's insights over PostgreSQL: a few statements, each on an index the engine
already keeps, so the overview answers as fast over a million runs as over a hundred.

- runs by status: counted among the newest ``SAMPLE`` runs (``runs_newest``), never over the
  whole table;
- started and ended per minute over the last hour: range scans of ``runs_newest`` (by
  ``created_at``) and of ``runs_finished`` (by ``completed_at``, terminal runs only);
- failing work: held runs are found from ``workflow_tasks`` (a held run keeps its task, and
  that table holds live tasks only), failed runs from ``runs_finished`` over the last day,
  retrying activities from ``activity_tasks`` (live tasks only), each with its newest failure
  from ``activity_attempts`` (by its key);
- a run's pending activities: ``activity_tasks_run``;
- the children of the runs of a page of the runs list: ``runs_children``, at most
  ``MAX_CHILDREN_COUNTED + 1`` index entries a run.

The statements run on a connection of the adapter's own pool (``PostgresAdapter.reading``;
the pool's sessions are in autocommit and each read here is one statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.schema import Statements
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo
from dex.serialization.values import decode_failure
from dex.web.insights import (
    MAX_CHILDREN_COUNTED,
    SAMPLE,
    FailingWork,
    Minute,
    PendingActivity,
    StatusCounts,
    describe,
    minutes_of,
    pending_from_history,
)

LIVE_TASKS = 10_000  # held runs are looked for among this many live workflow tasks


class PostgresInsights:
    """:class:`dex.web.insights.Insights` in SQL over the adapter's schema."""

    def __init__(self, adapter: PostgresAdapter, sample: int = SAMPLE) -> None:
        self._adapter, self._q, self._sample = adapter, Statements(adapter.schema), sample

    def status_counts(self) -> StatusCounts:
        with self._adapter.reading() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT status, count(*) FROM (SELECT status FROM {s}.runs"
                    " ORDER BY created_at DESC, position DESC LIMIT %s) newest GROUP BY status"
                ),
                [self._sample + 1],
            ).fetchall()
        counts = {status.value: 0 for status in RunStatus}
        for status, count in rows:
            counts[status] = int(count)
        total = sum(counts.values())
        return StatusCounts(counts=counts, sampled=min(total, self._sample), capped=total > self._sample)

    def per_minute(self, now: datetime) -> list[Minute]:
        starts = minutes_of(now)
        first = starts[0]
        with self._adapter.reading() as conn:
            started: dict[datetime, int] = dict(
                conn.execute(
                    self._q(
                        "SELECT date_trunc('minute', created_at), count(*) FROM {s}.runs"
                        " WHERE created_at >= %s GROUP BY 1"
                    ),
                    [first],
                ).fetchall()
            )
            ended: dict[datetime, int] = dict(
                conn.execute(
                    self._q(
                        "SELECT date_trunc('minute', completed_at), count(*) FROM {s}.runs"
                        " WHERE completed_at >= %s AND status IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED') GROUP BY 1"
                    ),
                    [first],
                ).fetchall()
            )
        return [Minute(start=s, started=int(started.get(s, 0)), ended=int(ended.get(s, 0))) for s in starts]

    def failing(self, limit: int) -> list[FailingWork]:
        since = self._adapter.clock.now() - timedelta(days=1)
        with self._adapter.reading() as conn:
            held = conn.execute(
                # LATERAL: each live task's run by its primary key; a join the planner may turn
                # into a scan of the whole runs table (its estimate of held runs is near zero);
                # the LIMIT 1 keeps the subquery from being flattened into such a join
                self._q(
                    "SELECT r.run_id, r.workflow_name, r.task_failure, r.started_at"
                    " FROM (SELECT run_id FROM {s}.workflow_tasks LIMIT %s) w CROSS JOIN LATERAL"
                    " (SELECT run_id, workflow_name, task_failure, started_at FROM {s}.runs"
                    "  WHERE run_id = w.run_id AND task_failure IS NOT NULL LIMIT 1) r LIMIT %s"
                ),
                [LIVE_TASKS, limit],
            ).fetchall()
            failed = conn.execute(
                self._q(
                    "SELECT run_id, workflow_name, failure, completed_at FROM {s}.runs"
                    " WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED') AND status = 'FAILED'"
                    " AND completed_at >= %s ORDER BY completed_at DESC LIMIT %s"
                ),
                [since, limit],
            ).fetchall()
            retrying = conn.execute(
                # with the newest failure its steps' kept attempts hold (by their key: one lookup each)
                self._q(
                    "SELECT t.run_id, t.name, t.attempt, t.visible_from, a.failures[1]"
                    " FROM (SELECT run_id, created_seq, name, attempt, visible_from FROM {s}.activity_tasks"
                    "  WHERE attempt > 1 ORDER BY visible_from DESC LIMIT %s) t"
                    " LEFT JOIN {s}.activity_attempts a ON a.run_id = t.run_id AND a.created_seq = t.created_seq"
                    " ORDER BY t.visible_from DESC"
                ),
                [limit],
            ).fetchall()
        found = [
            FailingWork(run_id=run_id, what="held run", name=name, failure=describe(_failure(blob)), when=started_at)
            for run_id, name, blob, started_at in held
        ]
        found += [
            FailingWork(run_id=run_id, what="failed run", name=name, failure=describe(_failure(blob)), when=at)
            for run_id, name, blob, at in failed
        ]
        found += [
            FailingWork(
                run_id=run_id,
                what="retrying activity",
                name=name,
                failure=describe(_failure(blob)) or f"attempt {attempt - 1} failed",
                when=visible_from,
                attempt=attempt,
            )
            for run_id, name, attempt, visible_from, blob in retrying
        ]
        return found[:limit]

    def pending_activities(self, run_id: str, history: Sequence[ev.HistoryEvent]) -> list[PendingActivity]:
        with self._adapter.reading() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT created_seq, name, attempt, state, visible_from, locked_until FROM {s}.activity_tasks"
                    " WHERE run_id = %s ORDER BY created_seq"
                ),
                [run_id],
            ).fetchall()
        now = self._adapter.clock.now()
        found = {}
        for seq, name, attempt, state, visible_from, locked_until in rows:
            shown = "waiting" if state == "CREATED" else "running" if locked_until and locked_until > now else "queued"
            found[seq] = PendingActivity(
                seq=seq,
                name=name,
                attempt=attempt,
                state=shown,
                next_attempt_at=visible_from if state == "CREATED" else None,
            )
        # a pending step the scheduler has not yet made a task for still shows
        for seq, name in pending_from_history(history):
            found.setdefault(
                seq, PendingActivity(seq=seq, name=name, attempt=None, state="scheduling", next_attempt_at=None)
            )
        return [found[seq] for seq in sorted(found)]

    def child_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        if not run_ids:
            return {}
        with self._adapter.reading() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT parent.run_id, (SELECT count(*) FROM (SELECT 1 FROM {s}.runs"
                    '  WHERE parent_run_id = parent.run_id COLLATE "C" LIMIT %s) counted)'
                    " FROM unnest(%s::text[]) AS parent(run_id)"
                ),
                [MAX_CHILDREN_COUNTED + 1, list(run_ids)],
            ).fetchall()
        return {run_id: int(count) for run_id, count in rows if count}


def _failure(blob: bytes | None) -> FailureInfo | None:
    if blob is None:
        return None
    try:
        return decode_failure(blob)
    except ValueError:  # one unreadable failure must not hide the others on the page
        return None
