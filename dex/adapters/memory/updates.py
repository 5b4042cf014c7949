"""The in-memory adapter's update answers (:class:`dex.app.ports.updates.UpdateAnswers`).

The answers live in :class:`~dex.adapters.memory.state.MemoryState` (``update_answers``),
written by :mod:`dex.adapters.memory.tasks` with the history block they belong to; a caller
waits on the state's ``answered`` condition, which every write of answers notifies. Part of
:class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

import time
from datetime import datetime

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.domain import events as ev
from dex.domain.task import UpdateAnswer


class MemoryUpdates:
    """Update requests and their answers in the in-memory store."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        storable.text(run_id, "run_id")
        storable.protobuf(request, "update request")
        with self._state.lock:
            known = self._state.update_answers.get((run_id, request.update_id))
            if known is not None and not known.rejected and run_id in self._state.runs:
                return known
            self._state.live_run(run_id)
            self._state.update_answers.pop((run_id, request.update_id), None)  # a rejection: tried again
            self._state.push(run_id, request, now)
            return None

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        with self._state.lock:
            return self._state.update_answers.get((run_id, update_id))

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._state.answered:
            while True:
                answer = self._state.update_answers.get((run_id, update_id))
                left = deadline - time.monotonic()
                if answer is not None or left <= 0:
                    return answer
                self._state.answered.wait(left)
