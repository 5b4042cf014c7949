"""The port of exactly-once database steps and transactional starts (docs/reference/contract.md §9).

A transaction step (``@dex.transaction``) runs its function and writes its completion in one
transaction of the store's own database, so the function's writes and the step's outcome
commit together or not at all. The application's own transaction can start runs and send
events too (``connection=``). Both are part of :class:`dex.app.ports.store.Store`; the in-memory
adapter imitates the step with a connection factory and refuses ``connection=``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Protocol

import attrs

from dex.app.ports.tasks import ActivityTask, WorkflowTask
from dex.domain import events as ev
from dex.domain.task import NewActivityTask, WorkflowTaskResult
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


@attrs.frozen(kw_only=True)
class StepCheckpoint:
    """A workflow task that reached the first attempt of a transaction step, for
    :meth:`TransactionSteps.checkpoint_steps`: the task's ``result`` so far (without the step's
    activity task), the ``step`` it waits on and the step's ``work`` (as in :class:`TransactionStep`)."""

    task: WorkflowTask
    result: WorkflowTaskResult
    step: NewActivityTask
    work: Callable[[Any], Payload]


@attrs.frozen
class Checkpointed:
    """A step that committed with its task's checkpoint: its outcome is the run's inbox message
    ``message_id``, and the run's history now ends at ``last_seq``."""

    message_id: int
    message: ev.ActivityTaskCompleted
    last_seq: int


# per checkpoint: committed; or how the step's function failed (rolled back, nothing written);
# or None: the workflow task is no longer this worker's (its lease moved on, or its history did)
CheckpointOutcome = Checkpointed | BaseException | None


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
    @property
    def lost_step_slots(self) -> int:
        """Transaction step slots given up by attempts still running whose lease was lost (their
        session ended at their ``lock_timeout``; the slot serves other steps meanwhile, and what
        they return is dropped): ``Engine.health().lost_step_slots``. 0 where steps run unwatched."""
        ...

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        """In one transaction of the store's database: lock the step's task and check that its
        lease still holds, run the step's work with that transaction's connection, write its
        completion as ``complete_activity_tasks`` does (history message, task removed, the
        run's workflow task made due), and commit. False: the lease was lost; nothing ran and
        nothing was written. An exception rolls it all back: ``StepFailed`` when the step
        failed (its function raised, or its transaction met a serialization failure or a
        deadlock, SQLSTATE 40001 / 40P01), any other for a failure of the store's own."""
        ...

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        """The first attempts of transaction steps run inside their workflow tasks
        (:mod:`dex.app.workflows.step_groups`), in one transaction of the store's database at READ
        COMMITTED: lock the runs and the workflow tasks still held by their leases (at the
        expected ``last_seq``); run each step's work (one that fails is left out: its writes
        roll back, and the others' stand or are made again); for each that succeeded, write its task's
        result so far as ``complete_workflow_tasks`` would, but keep the task, and put the step's
        outcome in the run's inbox; commit. A crash before the commit leaves nothing; after it,
        the run stands as if the step had run as a task of its own. An exception (the store
        failed) rolls it all back: every step's attempt failed."""
        ...

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        """``create_run`` through the application's ``connection`` (its transaction, never
        committed here). TypeError for a connection this store cannot use."""
        ...

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        """``send_message`` through the application's ``connection``, as ``create_run_in``."""
        ...
