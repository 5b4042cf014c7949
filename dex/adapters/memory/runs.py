"""The in-memory adapter's runs: creating them, reading them, and messages to them.

Creating a run (or finding the live run that holds its instance id), the reads of the run
records and histories, messages and status requests to a live run, and the retention that
deletes finished runs; the first task of a run just started, claimed at once (eager dispatch).
Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Sequence
from datetime import datetime

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tables import RunRow
from dex.app.ports.store import WORKFLOW, Claim, Loaded, RunFilter, RunRecord, StepEndings, WorkflowInput, WorkflowTask
from dex.domain import events as ev
from dex.domain.errors import RunNotFoundError
from dex.domain.status import RunStatus, requested
from dex.domain.task import InboxMessage, deadline_message


class MemoryRuns:
    """The run-store operations of the in-memory adapter."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        storable.created(run_id, created)
        with self._state.lock:
            existing = self._state.find_live_instance(created.instance_id)
            if existing is not None:
                return existing
            self._state.insert_run(run_id, created, now)
            deadline = deadline_message(run_id, created)
            if deadline is not None:  # the cancel request a deadline makes waits in the inbox
                self._state.push(run_id, deadline.event, deadline.visible_from)
            return run_id

    def claim_new_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[list[WorkflowTask], list[Loaded]]:
        """The first workflow task of the run just created, claimed for ``claim``, when the
        scheduler would create it at once anyway (no concurrency key, the queue active with
        room); none otherwise. The caller holds the state's lock since it created the run."""
        state = self._state
        with state.lock:
            if created.concurrency_key is not None or created.workflow_name not in claim.names:
                return [], []
            queue = state.queue(created.queue, WORKFLOW)
            if queue.held_back or state.active_workflow_tasks(queue.name) >= queue.capacity:
                return [], []
            task = state.add_workflow_task(state.runs[run_id], queue.name)
            task.lease.take(claim.owner, now + claim.lease)
            started = state.inbox[run_id][0]  # RunStarted (a deadline's cancel waits behind it)
            inbox = [InboxMessage(message_id=started.message_id, event=started.event)]
            return [task.claimed()], [WorkflowInput(events=list(state.runs[run_id].history), inbox=inbox)]

    def get_run(self, run_id: str) -> RunRecord | None:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.runs.get(run_id)
            return row.record() if row is not None else None

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        storable.texts(run_ids, "run_id")
        with self._state.lock:
            rows = (self._state.runs.get(run_id) for run_id in dict.fromkeys(run_ids))
            return [row.record() for row in rows if row is not None]

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        storable.text(run_filter.workflow_name, "workflow_name")
        storable.text(run_filter.instance_id, "instance_id")
        storable.text(run_filter.code_version, "code_version")
        storable.text(run_filter.parent_run_id, "parent_run_id")
        storable.labels(run_filter.labels)
        with self._state.lock:
            rows = [row for row in self._state.runs.values() if _matches(row, run_filter)]
            rows.sort(key=lambda r: (r.created_at, r.position), reverse=True)
            return [row.record() for row in rows[: run_filter.limit]]

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.runs.get(run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            return list(row.history)

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.runs.get(run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            history = row.history
            start = bisect_right(history, after_seq, key=lambda item: item.sequence_number)
            return list(history[start : start + max(limit, 0)])

    def history_bounds(self, run_id: str) -> tuple[int, int]:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.runs.get(run_id)
            if row is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            return row.history[0].sequence_number, row.history[-1].sequence_number

    def step_endings(self, run_id: str, created_seqs: Collection[int], after_seq: int, limit: int) -> StepEndings:
        wanted = frozenset(created_seqs)
        with self._state.lock:
            row = self._state.runs.get(run_id)
            if row is None:
                return StepEndings()
            history = row.history
            start = bisect_right(history, after_seq, key=lambda item: item.sequence_number)
            read = history[start : start + max(limit, 0)]
        found = tuple(
            item
            for item in read
            if isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed))
            and item.event.created_seq in wanted
        )
        return StepEndings(events=found, complete=len(read) < limit or len(found) == len(wanted))

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        storable.text(run_id, "run_id")
        storable.protobuf(message, "message")
        with self._state.lock:
            self._state.live_run(run_id)
            self._state.push(run_id, message, now)

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        storable.text(run_id, "run_id")
        storable.protobuf(message, "message")
        with self._state.lock:
            row = self._state.live_run(run_id)
            requested(row.status, target)
            if target is not RunStatus.CANCELLED:
                row.status = target
            elif any(isinstance(m.event, ev.RunCancelled) and m.visible_from <= now for m in self._state.inbox[run_id]):
                return  # a cancel is already on its way (a deadline's, waiting for its time, is not)
            self._state.push(run_id, message, now)

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        with self._state.lock:
            # the runs that ended first go first, as in PostgreSQL (ORDER BY completed_at)
            ended = [
                row
                for row in self._state.runs.values()
                if row.status.is_terminal and row.completed_at is not None and row.completed_at < completed_before
            ]
            ended.sort(key=lambda row: (row.completed_at, row.position))
            doomed = [row.run_id for row in ended[:limit]]
            for run_id in doomed:
                del self._state.runs[run_id]
                self._state.inbox.pop(run_id, None)
                self._state.attempts.pop(run_id, None)
                for key in [k for k in self._state.update_answers if k[0] == run_id]:
                    del self._state.update_answers[key]
                self._state.published.pop(run_id, None)
                self._state.streams.pop(run_id, None)
                task_id = self._state.workflow_task_of_run.pop(run_id, None)  # a stale claim's task goes too
                if task_id is not None:
                    del self._state.workflow_tasks[task_id]
            return len(doomed)


def _matches(row: RunRow, run_filter: RunFilter) -> bool:
    c = row.created
    if run_filter.workflow_name is not None and c.workflow_name != run_filter.workflow_name:
        return False
    if run_filter.statuses is not None and row.status not in run_filter.statuses:
        return False
    if run_filter.instance_id is not None and c.instance_id != run_filter.instance_id:
        return False
    if run_filter.code_version is not None and c.code_version != run_filter.code_version:
        return False
    if run_filter.parent_run_id is not None and c.parent_run_id != run_filter.parent_run_id:
        return False
    if run_filter.top_level and c.parent_run_id is not None:
        return False
    if run_filter.created_after is not None and row.created_at <= run_filter.created_after:
        return False
    if run_filter.created_before is not None and row.created_at >= run_filter.created_before:
        return False
    labels = dict(row.current_labels)
    return all(labels.get(k) == v for k, v in run_filter.labels)
