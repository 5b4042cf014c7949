"""The port of exactly-once database steps and transactional starts (SPEC §9).

A transaction step (``@dex.transaction``) runs its function and writes its completion in one
transaction of the store's own database, so the function's writes and the step's outcome
commit together or not at all. The application's own transaction can start runs and send
events too (``connection=``). Both are part of :class:`dex.app.ports.Store`; the in-memory
adapter imitates the step with a connection factory and refuses ``connection=``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, Protocol

import attrs

from dex.app.task_records import ActivityTask
from dex.domain import events as ev
from dex.domain.values import Payload


@attrs.frozen(kw_only=True)
class TransactionStep:
    """An attempt of a transaction step, for :meth:`TransactionSteps.complete_in_transaction`.

    ``work(conn)`` runs the function on the transaction's connection and returns its encoded
    result; for an ``async def``, ``async_work(conn)`` is that coroutine, which ``run_async``
    runs to its end on the worker's event loop. Either raises :class:`StepFailed` when the
    function failed.
    """

    task: ActivityTask
    isolation: str
    work: Callable[[Any], Payload] | None = None
    async_work: Callable[[Any], Coroutine[Any, Any, Payload]] | None = None
    run_async: Callable[[Coroutine[Any, Any, Any]], Any] | None = None


class StepFailed(Exception):
    """A transaction step's function failed with ``cause``: its writes are rolled back."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("the transaction step's function failed")
        self.cause = cause


@attrs.frozen
class LoopConnection:
    """An application's asynchronous connection and the event loop it belongs to: what the
    asyncio facade hands the store for ``connection=`` (the store's statements are sent on
    it through that loop while the caller awaits)."""

    connection: object
    loop: Any


class TransactionSteps(Protocol):
    def complete_in_transaction(self, step: TransactionStep) -> bool:
        """In one transaction of the store's database: lock the step's task and check that its
        lease still holds, run the step's work with that transaction's connection, write its
        completion as ``complete_activity_tasks`` does (history message, task removed, the
        run's workflow task made due), and commit. False: the lease was lost; nothing ran and
        nothing was written. An exception (``StepFailed``, a store error) rolls it all back."""
        ...

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        """``create_run`` through the application's ``connection`` (its transaction, never
        committed here). TypeError for a connection this store cannot use."""
        ...

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        """``send_message`` through the application's ``connection``, as ``create_run_in``."""
        ...
