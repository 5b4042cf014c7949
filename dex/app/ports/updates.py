"""The port for ``engine.update``'s answers (docs/reference/contract.md §14): the request goes
into the run's inbox, the answer comes back by update id.

A workflow task's result carries its :class:`~dex.domain.task.UpdateAnswer`\\ s
(``WritePlan.update_answers``); the store keeps them by (run, update id) in the same
transaction as the history block and wakes whoever waits for one. An accepted update's answer
never changes once written, which is what makes a repeated ``update_id`` safe: its caller gets
the recorded answer and nothing runs twice. A rejection leaves no trace in the history, so the
same id may be tried again: a new request replaces the rejection kept for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from dex.app.ports.tasks import WorkflowTask
from dex.domain import events as ev
from dex.domain.task import UpdateAnswer

if TYPE_CHECKING:  # the store port imports this one: its records are named for the checker only
    from dex.app.ports.store import Claim, Loaded


class UpdateAnswers(Protocol):
    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        """The recorded answer to ``request.update_id`` when the run has one that is not a
        rejection (then nothing is written); otherwise drop a rejection kept for that id and put
        ``request`` in the live run's inbox, and return None. RunNotFoundError, or
        InvalidStateError for a run that has ended (and has no such answer)."""
        ...

    def request_update_then_claim(
        self, run_id: str, request: ev.UpdateRequested, now: datetime, claim: Claim
    ) -> tuple[UpdateAnswer | None, list[WorkflowTask], list[Loaded]]:
        """``request_update``, then, in the same transaction, when the request was written,
        schedule the run's workflow task under the scheduler's rules (pause, capacity,
        suspension; a concurrency key only its holder gets at once) and claim workflow tasks for
        ``claim``, with their input loaded from ``claim.after_seqs`` as
        ``complete_activity_tasks_then_claim`` does: the engine that holds the run's executor
        decides the update at once, with no scheduler round and no poll. The claimed tasks and
        their inputs come back with the answer (empty when there was one)."""
        ...

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        """The answer kept for ``update_id`` of the run, if there is one."""
        ...

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        """:meth:`update_answer`, waiting up to ``timeout`` seconds for it to be written (woken
        when it is, not polled); None if it has not come by then."""
        ...
