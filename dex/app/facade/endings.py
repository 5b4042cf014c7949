"""How the application ends runs at once (docs/reference/contract.md §14, §15):
:class:`RunEnds`, the service behind ``Engine.terminate`` and ``Engine.cancel``.

``terminate`` needs no workflow code (:func:`dex.domain.task.terminate` decides it from the
history), so the store applies it at the call: the run is TERMINATED when the call returns,
whether or not any engine has its code. ``cancel`` is a request to the workflow code, which
cleans up; but a CREATED run that no engine can run (neither this one nor any live engine
registers its workflow) has no code to ask, and is cancelled at the call
(:func:`dex.domain.endings.cancel_unstarted`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from dex.app.facade.messages import RunMessages
from dex.app.facade.reads import run_id_of
from dex.app.machinery.threads import Foreground
from dex.app.ports.store import Store
from dex.domain import events as ev
from dex.domain.definitions import validate_text
from dex.domain.endings import cancel_unstarted
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, WorkflowTaskResult, terminate


class RunEnds:
    """Ends runs of ``store``; ``workflows`` are the names this engine registers, ``messages``
    sends the cancel requests that workflow code handles; ``ended`` wakes the callers of
    ``wait``; ``nudge_scheduler`` wakes the scheduler (a terminated run's children are sent
    requests)."""

    def __init__(
        self,
        store: Store,
        workflows: Collection[str],
        messages: RunMessages,
        *,
        foreground: Foreground,
        ended: Callable[[], None],
        nudge_scheduler: Callable[[], None],
    ) -> None:
        self._store = store
        self._workflows = frozenset(workflows)
        self._messages = messages
        self._foreground = foreground
        self._ended = ended
        self._nudge_scheduler = nudge_scheduler

    def terminate(self, run_id: str, reason: str = "") -> None:
        """``Engine.terminate``: RunNotFoundError, InvalidStateError for a run that has ended."""
        run_id = run_id_of(run_id)
        reason = validate_text(reason, "reason")
        now = self._store.clock.now()

        def decide(history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage]) -> WorkflowTaskResult:
            return terminate(run_id, history, inbox, reason, now)

        with self._foreground.calling():
            self._store.end_run(run_id, decide, now)
        self._ended()
        self._nudge_scheduler()

    def cancel(self, run_id: str, reason: str = "") -> None:
        """``Engine.cancel``: a request to the code, or at once for a run no engine can run."""
        run_id = run_id_of(run_id)
        reason = validate_text(reason, "reason")
        if self._cancel_unrunnable(run_id, reason):
            return
        self._messages.cancel(run_id, reason)

    def _cancel_unrunnable(self, run_id: str, reason: str) -> bool:
        with self._foreground.calling():
            run = self._store.get_run(run_id)
            if run is None or run.status is not RunStatus.CREATED or run.workflow_name in self._workflows:
                return False
            now = self._store.clock.now()
            if any(run.workflow_name in e.workflows for e in self._store.list_engines(now)):
                return False

            def decide(history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage]) -> WorkflowTaskResult | None:
                return cancel_unstarted(run_id, history, inbox, reason, now)

            ended = self._store.end_run(run_id, decide, now)
        if ended:
            self._ended()
        return ended
