"""The endings port (docs/reference/contract.md §14): a run ended at the call, by a result no
worker's workflow task made.

``engine.terminate`` (:func:`dex.domain.task.terminate`) and the cancel of a run that no engine
can run (:func:`dex.domain.endings.cancel_unstarted`) are decided from the run's history and
inbox alone; the store reads both under the run's lock, asks ``decide`` for the result, and
writes it as it writes a workflow task's (the history block, outcome, messages to parent and
children, dropped tasks), all or nothing. A worker holding the run's workflow task loses it:
its result no longer matches the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from dex.domain import events as ev
from dex.domain.task import InboxMessage, WorkflowTaskResult

Decide = Callable[[Sequence[ev.HistoryEvent], Sequence[InboxMessage]], WorkflowTaskResult | None]
"""The ending, from the run's history and visible inbox; None: not applicable (nothing written)."""


class RunEndings(Protocol):
    def end_run(self, run_id: str, decide: Decide, now: datetime) -> bool:
        """Apply ``decide``'s result to the live run ``run_id``; False when it returned None.
        RunNotFoundError for an unknown run, InvalidStateError for one that has ended; what
        ``decide`` raises comes through, and nothing is written."""
        ...
