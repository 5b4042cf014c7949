"""The port for ``engine.update``'s answers (docs/reference/contract.md §14): the request goes
into the run's inbox, the answer comes back by update id.

A workflow task's result carries its :class:`~dex.domain.task.UpdateAnswer`\\ s
(``WritePlan.update_answers``); the store keeps them by (run, update id) in the same
transaction as the history block and wakes whoever waits for one. An accepted update's answer
never changes once written, which is what makes a repeated ``update_id`` safe: its caller gets
the recorded answer and nothing runs twice. A rejection leaves no trace in the history, so the
same id may be tried again: a new request replaces the rejection kept for it.

The request that also claims its run's workflow task (``request_update_then_claim``) is a port
of :mod:`dex.app.ports.store` (``UpdateDispatch``), beside the other claims it shares records with.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from dex.domain import events as ev
from dex.domain.task import UpdateAnswer


class UpdateAnswers(Protocol):
    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        """The recorded answer to ``request.update_id`` when the run has one that is not a
        rejection (then nothing is written); otherwise drop a rejection kept for that id and put
        ``request`` in the live run's inbox, and return None. RunNotFoundError, or
        InvalidStateError for a run that has ended (and has no such answer)."""
        ...

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        """The answer kept for ``update_id`` of the run, if there is one."""
        ...

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        """:meth:`update_answer`, waiting up to ``timeout`` seconds for it to be written (woken
        when it is, not polled); None if it has not come by then."""
        ...
