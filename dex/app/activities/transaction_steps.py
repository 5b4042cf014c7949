"""Running a transaction step's attempt (``@dex.transaction``).

An ordinary activity's attempt produces an outcome that the result buffer writes later. A
transaction step's attempt instead hands the store a :class:`~dex.app.ports.store.TransactionStep`:
the store checks the task's lease, runs the function on its own transaction's connection and
writes the completion in that same transaction (``Store.complete_in_transaction``). So the
attempt ends in one of three ways:

* written: the function's writes and the step's result committed together (:class:`Written`);
* lost: the task's lease had been taken over, nothing ran (:class:`Written` with ``committed``
  False; the new holder runs it);
* failed: the function raised: everything rolled back, and the attempt's failure (retried
  under the step's policy, ``TerminalError`` at once) goes through the buffer like any
  activity's. A serialization failure or deadlock (SQLSTATE 40001, 40P01) is the step's own,
  an ordinary, retryable failure, wherever in its transaction it came;
* given back: the store failed otherwise (a connection lost, a full pool, a bug of dex's):
  everything rolled back, and the task is given back to run again *as the same attempt*
  (a retry that does not count, ``ActivityOutcome.counts``), after a backoff that grows with
  such give-backs. A store outage never uses up a step's attempts. ``drain()``, whose virtual
  clock skips those backoffs, raises instead once the store failed one step
  :data:`STUCK_ROUNDS` times in a row (:attr:`TransactionAttempts.stuck`), naming the step and
  the failure: a store that fails every time would otherwise keep it busy forever.

The function gets the store's connection as it is (a real ``psycopg.Connection`` on
PostgreSQL); refusing what would end its transaction is the store's part, which knows the
connection (on PostgreSQL, :mod:`dex.adapters.postgres.step_connections`): committing, rolling
back or closing it is a terminal failure naming the step, even when the function swallows the
error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from dex.app.definitions.activity_context import ActivityContext, reset_activity_context, set_activity_context
from dex.app.ports.store import ActivityOutcome, ActivityTask, StepFailed, TransactionStep, TransactionSteps
from dex.domain.definitions import ActivityDefinition, PayloadConverter
from dex.domain.errors import SerializationError
from dex.domain.values import FailureInfo, Payload

log = logging.getLogger("dex.worker")


@attrs.frozen(kw_only=True)
class Written:
    """A transaction step's attempt the store decided: committed, or its lease was lost."""

    task: ActivityTask
    committed: bool


# how many times in a row the store may fail one step before drain() raises, naming it
STUCK_ROUNDS = 20


def _described(exc: BaseException) -> str:
    """``exc``'s type and text, or its type alone when its text cannot be had (a hostile
    ``__str__``)."""
    try:
        name = type(exc).__name__
    except BaseException:  # noqa: BLE001 - a hostile type: nothing more to say
        return "an exception"
    try:
        return f"{name}: {str(exc)[:200]}"
    except BaseException:  # noqa: BLE001 - as above
        return name


class TransactionAttempts:
    """Hands a transaction step's attempt to the store and says how it ended."""

    def __init__(
        self,
        store: TransactionSteps,
        converter: PayloadConverter,
        run_async: Callable[[Any], Any],
        failed: Callable[[ActivityTask, BaseException], ActivityOutcome],
        took: Callable[[str, float], None],
        given_back: Callable[[ActivityTask], ActivityOutcome],
    ) -> None:
        self._store, self._converter, self._run_async, self._failed = store, converter, run_async, failed
        self._given_back = given_back
        # how long the step's function ran (not its transaction's own statements): what decides
        # whether its first attempts may run in a group (dex.app.workflows.step_groups)
        self._took = took
        # the tasks given back STUCK_ROUNDS times or more in a row, and the store's last failure of
        # each: what drain() raises, where a started engine waits out the backoff (a store that
        # fails every time under drain() would otherwise be tried again forever, at once, as
        # the virtual clock skips each backoff). Written from the attempts' threads, read by drain.
        self._stuck: dict[int, str] = {}
        self._lock = threading.Lock()

    def attempt(
        self, task: ActivityTask, definition: ActivityDefinition, args: Sequence[Any]
    ) -> ActivityOutcome | Written:
        """Run the attempt; never raises (a failure of any kind is the attempt's outcome)."""
        assert definition.isolation is not None
        fn, name = definition.fn, task.name
        work = self.work_of(definition, args)

        async def async_work(conn: Any) -> Payload:
            started = time.perf_counter()
            try:
                value = await fn(conn, *args)
            except BaseException as exc:  # noqa: BLE001 - as above; BaseException must not stop the loop
                raise StepFailed(exc) from None
            finally:
                self._took(name, time.perf_counter() - started)
            return self._encode(value)

        step = TransactionStep(
            task=task,
            isolation=definition.isolation,
            work=None if definition.is_async else work,
            async_work=async_work if definition.is_async else None,
            run_async=self._run_async,
        )
        try:
            committed = self._store.complete_in_transaction(step)
        except StepFailed as failed:
            self._note_decided(task)
            return self.failed(task, failed.cause)
        except BaseException as exc:
            log.warning(
                "transaction step %s of run %s, attempt %d: the store failed; the attempt is rolled back"
                " and runs again (it does not count)",
                task.name,
                task.run_id,
                task.attempt,
                exc_info=not isinstance(exc, ConnectionError),
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )
            self._note_given_back(task, exc)
            return self._given_back(task)
        self._note_decided(task)
        return Written(task=task, committed=committed)

    @property
    def stuck(self) -> str | None:
        """A transaction step the store failed :data:`STUCK_ROUNDS` times in a row, and how it
        failed last; None while there is none."""
        with self._lock:
            return next(iter(self._stuck.values()), None)

    def _note_given_back(self, task: ActivityTask, exc: BaseException) -> None:
        rounds = task.lease.version - task.attempt + 1  # its claims that did not count, this one's too
        if rounds < STUCK_ROUNDS:
            return
        said = (
            f"transaction step {task.name!r} of run {task.run_id}: the store failed it {rounds} times in a row"
            f" (last: {_described(exc)}); it is given back and retried with backoff"
        )
        with self._lock:
            self._stuck[task.task_id] = said

    def _note_decided(self, task: ActivityTask) -> None:
        if self._stuck:
            with self._lock:
                self._stuck.pop(task.task_id, None)

    def failed(self, task: ActivityTask, cause: BaseException) -> ActivityOutcome:
        """The outcome of an attempt whose function failed with ``cause``."""
        if isinstance(cause, SerializationError):  # its result cannot be stored: retrying will not help
            return ActivityOutcome(task=task, failure=FailureInfo.from_exception(cause, terminal=True))
        return self._failed(task, cause)

    def work_of(
        self, definition: ActivityDefinition, args: Sequence[Any], context: ActivityTask | None = None
    ) -> Callable[[Any], Payload]:
        """A synchronous step's work: its function on the store's connection, the result encoded
        (:class:`StepFailed` when the function failed); with ``context``, under that attempt's
        activity context (``heartbeat()`` only reports True: the step holds its row locks)."""
        fn, name = definition.fn, definition.name
        activity = (
            None
            if context is None
            else ActivityContext(
                run_id=context.run_id, activity_name=name, attempt=context.attempt, heartbeat_fn=lambda: True
            )
        )

        def work(conn: Any) -> Payload:
            started = time.perf_counter()
            token = None if activity is None else set_activity_context(activity)
            try:
                value = fn(conn, *args)
            except BaseException as exc:  # noqa: BLE001 - whatever the function raised fails the attempt
                raise StepFailed(exc) from None
            finally:
                self._took(name, time.perf_counter() - started)
                if token is not None:
                    reset_activity_context(token)
            return self._encode(value)

        return work

    def _encode(self, value: object) -> Payload:
        try:
            return self._converter.encode(value)
        except SerializationError as exc:
            raise StepFailed(exc) from None
