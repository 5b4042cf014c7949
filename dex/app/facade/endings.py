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
from dex.domain.endings import cancel_unstarted, terminated
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, WorkflowTaskResult

_MAX_DESCENDANTS = 10_000  # terminated by one call; any beyond get the request, for a worker


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
        """``Engine.terminate``: RunNotFoundError, InvalidStateError for a run that has ended.

        Its live children (and theirs) are terminated by the call too, each in a write of its
        own: the request each was sent (``RunTerminated``) would otherwise wait for a worker
        that has the child's code. A child that ended meanwhile is left as it ended."""
        run_id = run_id_of(run_id)
        reason = validate_text(reason, "reason")
        with self._foreground.calling():
            children = self._terminate(run_id, reason)
            for _ in range(_MAX_DESCENDANTS):
                if not children:
                    break
                child, why = children.pop()
                try:
                    children += self._terminate(child, why)
                except (InvalidStateError, RunNotFoundError):
                    pass  # it ended on its own meanwhile (or never started: its instance id was held)
        self._ended()
        self._nudge_scheduler()  # a child left over still has its request in its inbox

    def _terminate(self, run_id: str, reason: str) -> list[tuple[str, str]]:
        """Terminate one run; the children it sent the request to, with its reason."""
        now = self._store.clock.now()
        decided: list[WorkflowTaskResult] = []

        def decide(history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage]) -> WorkflowTaskResult:
            decided.append(terminated(run_id, history, inbox, reason, now))
            return decided[-1]

        self._store.end_run(run_id, decide, now)
        return [
            (m.run_id, m.event.reason)
            for m in decided[-1].messages
            if isinstance(m.event, ev.RunTerminated) and m.run_id != run_id
        ]

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
