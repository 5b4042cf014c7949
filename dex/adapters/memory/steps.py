"""The in-memory adapter's transaction steps: the factory's connection stands in for the database's.

``InMemoryAdapter(transaction_connection=factory)`` gives each step (``@dex.transaction``) a
connection of ``factory``; the step's completion is written to the tables while its lease still
holds, and only then is that connection committed (otherwise rolled back). Steps run one at a
time (one shared connection, such as SQLite's ``:memory:``, then serves them all), and the two
commits are not atomic as on PostgreSQL: a testing stand-in. Without a factory a step that
never uses its connection still runs; one that does fails terminally, saying what to pass.
Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from dex.adapters.memory import step_connection, storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tasks import MemoryTasks
from dex.app.ports.store import ActivityOutcome, ActivityTask, Clock, StepFailed, TransactionStep
from dex.app.ports.transactions import Checkpointed, CheckpointOutcome, StepCheckpoint
from dex.domain import events as ev
from dex.domain.values import TerminalError


class MemorySteps:
    """Transaction steps and ``connection=`` starts (refused: there is no database transaction)."""

    def __init__(
        self,
        state: MemoryState,
        tasks: MemoryTasks,
        clock: Clock,
        transaction_connection: Callable[[], Any] | None,
        complete_activity_tasks: Callable[[Sequence[ActivityOutcome], datetime], list[bool]],
    ) -> None:
        if connection_factory_error := _factory_error(transaction_connection):
            raise TypeError(connection_factory_error)
        self._state = state
        self._tasks = tasks
        self._clock = clock
        # the adapter's port, so that what wraps it (a simulator's observer) sees steps' outcomes
        self._complete = complete_activity_tasks
        self._factory = transaction_connection  # None: a step that uses its connection fails, saying so
        self._step_lock = threading.RLock()  # steps run one at a time: one shared connection serves all

    @property
    def lost_step_slots(self) -> int:
        """Always 0: steps run one at a time here, unwatched (no ``lock_timeout`` ends them)."""
        return 0

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        """Check the lease, run the step's work on a connection of ``transaction_connection``
        (the store's lock is not held meanwhile), then, while the lease still holds, write the
        completion and commit that connection; otherwise roll it back. Steps run one at a time
        (so one shared connection, such as SQLite's ``:memory:``, serves them all). Not atomic
        as on PostgreSQL (a crash between the two commits is not simulated): a testing stand-in."""
        with self._step_lock:
            return self._complete_in_transaction(step)

    def _complete_in_transaction(self, step: TransactionStep) -> bool:
        task = step.task
        if not self._holds(task):
            return False
        conn = self._connection()
        try:
            try:
                if step.async_work is not None and step.run_async is not None:
                    result = step.run_async(step_connection.run_held_async(conn, task.name, step.async_work))
                else:
                    assert step.work is not None
                    result = step_connection.run_held(conn, task.name, step.work)
            except StepFailed as failed:
                raise _without_connection(failed, conn, task.name) from failed.cause
            applied = self._complete([ActivityOutcome(task=task, result=result)], self._clock.now())[0]
        except BaseException:
            _end(conn, "rollback")
            raise
        _end(conn, "commit" if applied else "rollback")
        return applied

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        """Each step as :meth:`complete_in_transaction` runs one: its work on the factory's
        connection, then, while its workflow task is still held at the expected history, the
        task's result so far written (the task kept) and the step's outcome put in the inbox,
        and the connection committed; a step that failed rolls it back. One commit per step,
        not one per group: a stand-in, like ``complete_in_transaction``."""
        storable.workflow_results([(item.task, item.result) for item in items])
        with self._step_lock:
            return [self._checkpoint(item, now) for item in items]

    def _checkpoint(self, item: StepCheckpoint, now: datetime) -> CheckpointOutcome:
        task = item.task
        with self._state.lock:
            if not self._tasks.holds_workflow_task(task, item.result.expected_last_seq):
                return None
        conn = self._connection()
        try:
            result = step_connection.run_held(conn, item.step.name, item.work)
        except StepFailed as failed:
            _end(conn, "rollback")
            return _without_connection(failed, conn, item.step.name).cause
        except BaseException:
            _end(conn, "rollback")
            raise
        message = ev.ActivityTaskCompleted(created_seq=item.step.created_seq, result=result)
        with self._state.lock:
            if not self._tasks.complete_workflow_task(task, item.result, now, keep=True):
                _end(conn, "rollback")
                return None
            message_id = self._state.push(task.run_id, message, now)
            last_seq = self._state.runs[task.run_id].history[-1].sequence_number
        _end(conn, "commit")
        return Checkpointed(message_id=message_id, message=message, last_seq=last_seq)

    def _connection(self) -> Any:
        """The factory's connection for one step; None without a factory (a step that
        never uses its connection still runs, as under ``drain()`` in tests)."""
        return self._factory() if self._factory is not None else None

    def _holds(self, task: ActivityTask) -> bool:
        with self._state.lock:
            row = self._state.activity_tasks.get(task.task_id)
            return row is not None and row.lease.is_(task.lease)

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        raise TypeError(_NO_CONNECTION)

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        raise TypeError(_NO_CONNECTION)


_NO_FACTORY = (
    "create the in-memory adapter with InMemoryAdapter(transaction_connection=<a function returning a DB-API"
    " connection>)"
)

_NO_CONNECTION = (
    "connection= needs the PostgreSQL adapter: the in-memory adapter has no database transaction to write through"
)


def _without_connection(failed: StepFailed, conn: Any, name: str) -> StepFailed:
    """A step that used the connection it does not have (no factory): a terminal failure that
    says what to do, not the ``AttributeError`` of ``None``; any other failure as it is."""
    if conn is None and isinstance(failed.cause, AttributeError) and "'NoneType'" in str(failed.cause):
        return StepFailed(
            TerminalError(
                f"transaction step {name!r} used its connection, but there is none ({failed.cause}): {_NO_FACTORY}"
            )
        )
    return failed


def _end(conn: Any, how: str) -> None:
    """Commit or roll back the factory's connection (one without the method is left as it is)."""
    end = getattr(conn, how, None)
    if callable(end):
        end()


def _factory_error(factory: object) -> str | None:
    if factory is None or callable(factory):
        return None
    return f"transaction_connection must be a callable returning a connection, or None, got {type(factory).__name__}"
