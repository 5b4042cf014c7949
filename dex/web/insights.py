"""What the overview and the run page show beyond single runs: runs by status, runs started
and ended per minute, failing work, a run's pending activities; and for the runs list, how
many children each run has.

``Insights`` is the small read port the pages need. ``PortInsights`` answers it through the
store's ports alone (the memory adapter, or any store): bounded reads of the newest runs.
``dex.web.pg_insights.PostgresInsights`` answers the same with a few indexed statements, so
the overview stays fast over a million runs; no statement counts every run (a count over the
whole table grows with it): runs by status are counted among the newest ``SAMPLE`` runs,
which the page says.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

import attrs

from dex.app.ports.store import RunFilter, Store
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo

SAMPLE = 10_000  # runs by status are counted among this many of the newest runs
WINDOW_MINUTES = 60
MAX_CHILDREN_COUNTED = 1000  # a run's children are counted up to this many (the runs list says "1000+")


@attrs.frozen(kw_only=True)
class StatusCounts:
    counts: dict[str, int]
    sampled: int  # how many of the newest runs were counted
    capped: bool  # True when there are more runs than were counted


@attrs.frozen(kw_only=True)
class Minute:
    start: datetime
    started: int
    ended: int


@attrs.frozen(kw_only=True)
class FailingWork:
    """A run whose workflow task keeps failing (held), a run that failed, or an activity
    being retried."""

    run_id: str
    what: str  # "held run", "failed run", "retrying activity"
    name: str
    failure: str
    when: datetime | None
    attempt: int | None = None


@attrs.frozen(kw_only=True)
class PendingActivity:
    seq: int
    name: str
    attempt: int | None  # None where the store has no task for it (yet)
    state: str  # "waiting" (for its first attempt or a retry), "queued", "running"
    next_attempt_at: datetime | None


class Insights(Protocol):
    def status_counts(self) -> StatusCounts: ...

    def per_minute(self, now: datetime) -> list[Minute]: ...

    def failing(self, limit: int) -> list[FailingWork]: ...

    def pending_activities(self, run_id: str, history: Sequence[ev.HistoryEvent]) -> list[PendingActivity]: ...

    def child_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        """How many children each run has, up to ``MAX_CHILDREN_COUNTED + 1`` (more than the
        most counted); a run with none is left out."""
        ...


def minutes_of(now: datetime) -> list[datetime]:
    """The starts of the last ``WINDOW_MINUTES`` whole minutes, up to the one ``now`` is in."""
    this = now.replace(second=0, microsecond=0)
    return [this - timedelta(minutes=WINDOW_MINUTES - 1 - i) for i in range(WINDOW_MINUTES)]


def describe(failure: FailureInfo | None) -> str:
    if failure is None:
        return ""
    return f"{failure.type}: {failure.message}" if failure.message else failure.type


def pending_from_history(history: Sequence[ev.HistoryEvent]) -> list[tuple[int, str]]:
    """Activities the history scheduled and has no outcome for: (sequence number, name)."""
    created: dict[int, str] = {}
    for item in history:
        event = item.event
        if isinstance(event, ev.ActivityTaskCreated):
            created[item.sequence_number] = event.name
        elif isinstance(event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)):
            created.pop(event.created_seq, None)
        elif isinstance(event, ev.RunCompleted):
            created.clear()  # an ended run's pending tasks are dropped
    return sorted(created.items())


class PortInsights:
    """Insights through the store's ports: bounded reads of the newest runs (for the memory
    adapter and small stores; PostgreSQL has :class:`dex.web.pg_insights.PostgresInsights`)."""

    def __init__(self, store: Store, sample: int = SAMPLE) -> None:
        self._store, self._sample = store, sample

    def status_counts(self) -> StatusCounts:
        rows = self._store.list_runs(RunFilter(limit=self._sample + 1))
        counts = {status.value: 0 for status in RunStatus}
        for row in rows[: self._sample]:
            counts[row.status.value] += 1
        return StatusCounts(counts=counts, sampled=min(len(rows), self._sample), capped=len(rows) > self._sample)

    def per_minute(self, now: datetime) -> list[Minute]:
        starts = minutes_of(now)
        first = starts[0]
        started = dict.fromkeys(starts, 0)
        ended = dict.fromkeys(starts, 0)
        for row in self._store.list_runs(RunFilter(limit=self._sample)):
            for moment, bucket in ((row.created_at, started), (row.completed_at, ended)):
                if moment is not None and moment >= first:
                    key = moment.replace(second=0, microsecond=0)
                    if key in bucket:
                        bucket[key] += 1
        return [Minute(start=s, started=started[s], ended=ended[s]) for s in starts]

    def failing(self, limit: int) -> list[FailingWork]:
        found = []
        for row in self._store.list_runs(RunFilter(statuses=frozenset({RunStatus.RUNNING}), limit=self._sample)):
            if row.task_failure is not None:
                found.append(
                    FailingWork(
                        run_id=row.run_id,
                        what="held run",
                        name=row.workflow_name,
                        failure=describe(row.task_failure),
                        when=row.started_at,
                    )
                )
        for row in self._store.list_runs(RunFilter(statuses=frozenset({RunStatus.FAILED}), limit=limit)):
            found.append(
                FailingWork(
                    run_id=row.run_id,
                    what="failed run",
                    name=row.workflow_name,
                    failure=describe(row.failure),
                    when=row.completed_at,
                )
            )
        return found[:limit]

    def pending_activities(self, run_id: str, history: Sequence[ev.HistoryEvent]) -> list[PendingActivity]:
        tasks = {step.created_seq: step.pending for step in self._store.step_attempts(run_id) if step.pending}
        found = []
        for seq, name in pending_from_history(history):
            task = tasks.get(seq)
            if task is None:  # its task is not written yet, or its outcome is on the way
                found.append(PendingActivity(seq=seq, name=name, attempt=None, state="pending", next_attempt_at=None))
                continue
            waiting = task.state == "waiting"
            found.append(
                PendingActivity(
                    seq=seq,
                    name=name,
                    attempt=task.attempt,
                    state=task.state,
                    next_attempt_at=task.visible_from if waiting else None,
                )
            )
        return found

    def child_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        counts = {}
        for run_id in run_ids:
            found = self._store.list_runs(RunFilter(parent_run_id=run_id, limit=MAX_CHILDREN_COUNTED + 1))
            if found:
                counts[run_id] = len(found)
        return counts
