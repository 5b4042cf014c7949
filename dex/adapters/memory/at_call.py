"""The in-memory adapter's endings applied at the call (docs/reference/contract.md §14):
``engine.terminate`` and the cancel of a run no engine can run, decided from the run's history
and inbox (:class:`~dex.app.ports.endings.RunEndings`) and written as a workflow task's result.
Part of :class:`dex.adapters.memory.InMemoryAdapter`."""

from __future__ import annotations

import operator
from datetime import datetime

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tasks import MemoryTasks
from dex.app.ports.endings import Decide
from dex.domain.task import InboxMessage
from dex.domain.writes import INBOX_ORDER

_INBOX_ORDER = operator.attrgetter(*INBOX_ORDER)  # the domain's order of a run's visible messages


class MemoryEndings:
    """Endings applied at the call, as a workflow task's result that no worker ran."""

    def __init__(self, state: MemoryState, tasks: MemoryTasks) -> None:
        self._state, self._tasks = state, tasks

    def end_run(self, run_id: str, decide: Decide, now: datetime) -> bool:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.live_run(run_id)
            visible = sorted((m for m in self._state.inbox[run_id] if m.visible_from <= now), key=_INBOX_ORDER)
            inbox = [InboxMessage(message_id=m.message_id, event=m.event) for m in visible]
            result = decide(list(row.history), inbox)
            if result is None:
                return False
            storable.workflow_results([(None, result)])
            # a worker's claim of the run's task is void: its result no longer matches the history
            task_id = self._state.workflow_task_of_run.pop(run_id, None)
            if task_id is not None:
                del self._state.workflow_tasks[task_id]
            self._tasks.apply_result(run_id, result, now)
            return True
