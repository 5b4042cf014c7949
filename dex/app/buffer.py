"""The result buffer: task outcomes gathered and written to the store in batches.

Writing a batch in one call (one transaction in PostgreSQL) instead of one per task is what
makes completions cheap. Whoever has nothing else to do flushes at once, so a lone workflow
is not slowed by the buffer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dex.app.ports import ActivityOutcome, Store, WorkflowTask
from dex.domain.task import WorkflowTaskResult

log = logging.getLogger("dex.buffer")


class ResultBuffer:
    """Completed workflow tasks and activity attempts waiting to be written."""

    def __init__(self, store: Store, *, max_batch: int = 256, on_flush: Callable[[], None] | None = None) -> None:
        self._store = store
        self._max_batch = max_batch
        self._on_flush = on_flush
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._full = threading.Condition(self._lock)
        self._workflow_results: list[tuple[WorkflowTask, WorkflowTaskResult]] = []
        self._activity_outcomes: list[ActivityOutcome] = []
        self.discarded = 0

    def add_workflow_result(self, task: WorkflowTask, result: WorkflowTaskResult) -> None:
        with self._lock:
            self._workflow_results.append((task, result))
            if len(self) >= self._max_batch:
                self._full.notify_all()

    def add_activity_outcome(self, outcome: ActivityOutcome) -> None:
        with self._lock:
            self._activity_outcomes.append(outcome)
            if len(self) >= self._max_batch:
                self._full.notify_all()

    def __len__(self) -> int:
        return len(self._workflow_results) + len(self._activity_outcomes)

    def wait_until_full(self, timeout: float) -> None:
        """Block until a batch is full or ``timeout`` seconds passed (the flusher's pacing)."""
        with self._lock:
            if len(self) < self._max_batch:
                self._full.wait(timeout)

    def flush(self) -> int:
        """Write everything buffered; return how many outcomes were written (applied or not)."""
        with self._flush_lock:
            with self._lock:
                workflow_results, self._workflow_results = self._workflow_results, []
                activity_outcomes, self._activity_outcomes = self._activity_outcomes, []
            if not workflow_results and not activity_outcomes:
                return 0
            now = self._store.clock.now()
            try:
                if activity_outcomes:
                    applied = self._store.complete_activity_tasks(activity_outcomes, now)
                    self._count_discarded("activity", [o.task.task_id for o in activity_outcomes], applied)
                if workflow_results:
                    applied = self._store.complete_workflow_tasks(workflow_results, now)
                    self._count_discarded("workflow", [t.task_id for t, _ in workflow_results], applied)
            except Exception:
                # nothing was acknowledged: the tasks' leases expire and they run again
                log.exception("flushing %d results failed", len(workflow_results) + len(activity_outcomes))
                raise
            if self._on_flush is not None:
                self._on_flush()
            return len(workflow_results) + len(activity_outcomes)

    def _count_discarded(self, kind: str, task_ids: list[int], applied: list[bool]) -> None:
        for task_id, ok in zip(task_ids, applied, strict=True):
            if not ok:
                self.discarded += 1
                log.warning("discarded the result of %s task %s: its lease was lost", kind, task_id)
