"""The application's messages to runs: :class:`RunMessages`, the service behind
``Engine.send_event``, ``cancel``, ``suspend`` and ``resume``.

Each writes one message to a run's inbox: an external event (batched with the engine's next
flush, or in the caller's transaction with ``connection``) or a transition request (written
at once, since an illegal one must raise at the call). The scheduler turns the inbox into a
workflow task, so each call then nudges it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dex.app.facade.reads import run_id_of
from dex.app.machinery.threads import Foreground
from dex.app.ports.store import Store
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, validate_name, validate_text
from dex.domain.status import RunStatus


class RunMessages:
    """Sends messages to the runs of ``store``.

    ``send_message`` writes an event with the engine's next batch and returns once it is
    written (raising what the store reports for it); ``nudge_scheduler`` wakes the scheduler
    of a started engine.
    """

    def __init__(
        self,
        store: Store,
        converter: PayloadConverter,
        *,
        foreground: Foreground,
        send_message: Callable[[str, ev.Message], None],
        nudge_scheduler: Callable[[], None],
    ) -> None:
        self._store = store
        self._converter = converter
        self._foreground = foreground
        self._send_message = send_message
        self._nudge_scheduler = nudge_scheduler

    def send_event(self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None) -> None:
        """``Engine.send_event``."""
        run_id = run_id_of(run_id)
        validate_name(event_id, "event id")
        message = ev.ExternalEventReceived(event_id=event_id, payload=self._converter.encode(payload))
        with self._foreground.calling():
            if connection is not None:
                self._store.send_message_in(connection, run_id, message, self._store.clock.now())
            else:
                self._send_message(run_id, message)
        self._nudge_scheduler()  # the scheduler makes the workflow task; it wakes the worker

    def cancel(self, run_id: str, reason: str = "") -> None:
        """``Engine.cancel``."""
        message = ev.RunCancelled(reason=validate_text(reason, "reason"))
        self._transition(run_id_of(run_id), RunStatus.CANCELLED, message)

    def suspend(self, run_id: str) -> None:
        """``Engine.suspend``."""
        self._transition(run_id_of(run_id), RunStatus.SUSPENDED, ev.RunSuspended())

    def resume(self, run_id: str) -> None:
        """``Engine.resume``."""
        self._transition(run_id_of(run_id), RunStatus.RUNNING, ev.RunResumed())

    def _transition(self, run_id: str, target: RunStatus, message: ev.Message) -> None:
        with self._foreground.calling():
            self._store.request_transition(run_id, target, message, self._store.clock.now())
        self._nudge_scheduler()  # the scheduler makes the workflow task; it wakes the worker
