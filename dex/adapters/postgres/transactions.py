"""Transaction steps and transactional starts on PostgreSQL (docs/reference/contract.md §9).

A transaction step's attempt is one transaction: the task row is locked ``FOR UPDATE`` and its
lease checked, the step's function runs on that connection, and the completion is written by
the very statements of :func:`dex.adapters.postgres.activity_tasks.complete_activity_tasks`;
then it commits (the run's workflow task is the scheduler's to make: see ``_complete``). While the function runs, the lock keeps every other worker off the task
(claims skip locked rows), so of two workers racing on one step at most one commits: a worker
whose lease was taken over before it locked the row finds another lease version and writes
nothing. Lock order: the task row first, then (in the completion) the run's row ``FOR SHARE``.
A workflow task that ends the run meanwhile locks the run and then waits for the task row;
that rare cycle is a deadlock PostgreSQL breaks by failing one side (a step's attempt is
retried; a batch of workflow results is written again by the buffer).

An ``async def`` step gets a ``psycopg.AsyncConnection`` of the adapter's own for async steps
(:mod:`.async_sessions`: kept from one step to the next, its session restored in between), and
its whole attempt is one coroutine on that connection's event loop (:func:`complete_async`):
the lease check, the function, the completion (the statements of
:func:`~dex.adapters.postgres.activity_tasks.completion_reads` and ``completion_writes``, which
the synchronous completion sends too) and the commit, in three round trips after the
function's own. Starts and events through the application's ``AsyncConnection``
(``connection=``) send dex's statements through :class:`LoopBridge`, each one on the
connection's loop from the caller's thread, never committing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq

from dex.adapters.postgres import activity_tasks
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import ActivityOutcome, ActivityTask, Clock, StepFailed, TransactionStep
from dex.app.ports.transactions import LoopConnection
from dex.domain.values import TerminalError

_LEVELS = {
    "read committed": psycopg.IsolationLevel.READ_COMMITTED,
    "repeatable read": psycopg.IsolationLevel.REPEATABLE_READ,
    "serializable": psycopg.IsolationLevel.SERIALIZABLE,
}

Run = Callable[[Coroutine[Any, Any, Any]], Any]


class _Result:
    """A statement's answer as the adapter's SQL functions read a cursor's."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows, self._rowcount = rows, rowcount

    def _wait(self) -> None:
        """Nothing to wait for: the answer is here (a held statement's comes later)."""

    @property
    def rowcount(self) -> int:
        self._wait()
        return self._rowcount

    def fetchall(self) -> list[Any]:
        self._wait()
        return self._rows

    def fetchone(self) -> Any:
        self._wait()
        return self._rows[0] if self._rows else None


class LoopBridge:
    """A ``psycopg.AsyncConnection`` seen as the blocking ``execute`` the adapter's SQL
    functions call: each statement is sent on the connection's event loop by ``run``, from
    another thread (the caller waits; the loop is free meanwhile)."""

    def __init__(self, conn: psycopg.AsyncConnection, run: Run) -> None:
        self.conn, self._run = conn, run

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None) -> _Result:
        async def go() -> _Result:
            cursor = await self.conn.execute(query, params, prepare=prepare)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return _Result(rows, cursor.rowcount)

        result: _Result = self._run(go())
        return result


def _lease_held(conn: Any, q: Statements, task: ActivityTask) -> int | None:
    """The transaction's id if the task's lease is still this attempt's (its row locked until the
    commit, so no claim, which skips locked rows, can take the task over), else None."""
    return _held_by(conn.execute(*_lease_check(q, task)).fetchone(), task)


def _lease_check(q: Statements, task: ActivityTask) -> tuple[Any, list[Any]]:
    return (
        q(
            "SELECT locked_by, lock_version, txid_current() FROM {s}.activity_tasks"
            " WHERE queue = %s AND task_id = %s FOR UPDATE"
        ),
        [task.queue, task.task_id],
    )


def _held_by(row: Any, task: ActivityTask) -> int | None:
    held = row is not None and (row[0], row[1]) == (task.lease.owner, task.lease.version)
    return int(row[2]) if held else None


CURRENT_TRANSACTION = "SELECT txid_current()"


def ended_by_the_function(name: str) -> StepFailed:
    """A step whose function ended dex's transaction (``COMMIT`` or ``ROLLBACK`` sent as SQL, where
    the guard refuses ``conn.commit()``): what it wrote before is committed or gone outside dex's
    transaction, so its outcome cannot be recorded with it. A terminal failure: running the
    function again could write twice what it committed."""
    return StepFailed(
        TerminalError(
            f"transaction step {name!r} ended the step's transaction itself (COMMIT or ROLLBACK sent as SQL):"
            " its outcome cannot be recorded with its writes; return to commit, raise to roll back"
        )
    )


def _complete(conn: Any, q: Statements, step: TransactionStep, result: Any, now: datetime) -> None:
    outcome = ActivityOutcome(task=step.task, result=result)
    _check_applied(activity_tasks.complete_activity_tasks(conn, q, [outcome], now), step)
    # The run's workflow task is left to the scheduler, which the engine wakes at once
    # (ActivityWorker.completed_directly): a dispatch here, as a batch completion makes, would
    # add two statements to every step and mostly lose the scheduler's try-lock to the other
    # steps under way (measured: about 15 % fewer workflows/s with it)


def _check_applied(applied: list[bool], step: TransactionStep) -> None:
    """The step's outcome applied, as it must while its row is locked: otherwise a bug, and the
    transaction rolls back."""
    if applied != [True]:
        raise RuntimeError(f"the lease of task {step.task.task_id} changed while its row was locked")


def _xid(row: Any) -> int | None:
    return int(row[0]) if row is not None else None


def statement_error(conn: psycopg.Connection | psycopg.AsyncConnection, exc: psycopg.Error) -> bool:
    """Whether ``exc``, raised by dex's statements after the step's function ran in the same
    transaction (the completion, the commit), is the step's own: an error the server reported
    for a statement on a session that is still there. What the function did to its transaction
    causes those: a ``SET LOCAL`` (a statement timeout of a millisecond, ``transaction_read_only``,
    a role that may not write dex's tables), a deferred constraint its writes break at the commit.
    So the attempt fails and counts, under the step's retry policy, where the store's failure
    would have run it again as the same attempt, and again, without end. A lost or ended session
    (no SQLSTATE, or a connection that is gone) stays the store's failure; serialization
    failures and deadlocks are the step's anyway (``step_store``)."""
    if exc.sqlstate is None or exc.sqlstate.startswith(_THE_SERVERS):
        return False
    return not conn.closed and not conn.broken


# SQLSTATE classes of the connection's or the server's failures, never a statement's: connection
# exceptions, insufficient resources (a full disk, out of memory), an ended session or a server
# shutting down (57P: an overrun's end is one), system errors, internal errors
_THE_SERVERS = ("08", "53", "57P", "58", "XX")


def failed_transaction(status: pq.TransactionStatus) -> StepFailed | None:
    if status == pq.TransactionStatus.INERROR:
        return StepFailed(
            RuntimeError("a statement of the step failed and its transaction is aborted (the error was caught)")
        )
    return None


def complete_sync(conn: psycopg.Connection, q: Statements, clock: Clock, step: TransactionStep) -> bool:
    """The step on a connection of the steps' own (:mod:`.step_sessions`), in autocommit:
    autocommit off and the isolation level set for its duration (psycopg then sends them with
    its BEGIN), both restored before it goes back."""
    assert step.work is not None
    conn.autocommit, conn.isolation_level = False, _LEVELS[step.isolation]
    ran = False
    try:
        with conn.transaction():
            began = _lease_held(conn, q, step.task)
            if began is None:
                return False
            result = step.work(conn)
            ran = True
            failed = failed_transaction(conn.info.transaction_status)
            if failed is not None:
                raise failed
            # the completion's statements whose answers are not read go out without waiting
            with conn.pipeline():
                current = conn.execute(CURRENT_TRANSACTION)
                _complete(conn, q, step, result, clock.now())
            if _xid(current.fetchone()) != began:  # the commit would not be the function's writes'
                raise ended_by_the_function(step.task.name)
        return True
    except psycopg.Error as exc:
        if ran and statement_error(conn, exc):
            raise StepFailed(exc) from None
        raise
    finally:
        if not conn.closed:
            conn.rollback()  # nothing is open after the block; this only makes sure
            conn.autocommit, conn.isolation_level = True, None


def complete_async(
    sessions: AsyncSessions,
    q: Statements,
    clock: Clock,
    step: TransactionStep,
    watch: Callable[[int], AbstractContextManager[object]],
) -> bool:
    """The step of an ``async def`` on an asynchronous connection of ``sessions`` (kept from one
    step to the next: async_sessions.py), watched by ``watch`` (given the session's process id)
    until just before the connection is given back. The whole attempt is one coroutine on the
    connection's loop, handed over once: taking the session, the lease check, the function, the
    completion's statements, the commit and giving the session back."""
    assert step.async_work is not None and step.run_async is not None

    async def attempt() -> bool:
        conn = await sessions.take(_LEVELS[step.isolation])
        try:
            with watch(conn.info.backend_pid):
                return await _complete_on_loop(conn, q, clock, step)
        finally:
            try:
                await sessions.give_back(conn)
            except Exception:  # noqa: BLE001 - the step's outcome stands; the session goes
                conn.pgconn.finish()

    done: bool = step.run_async(attempt())
    return done


async def _complete_on_loop(conn: psycopg.AsyncConnection, q: Statements, clock: Clock, step: TransactionStep) -> bool:
    assert step.async_work is not None
    try:
        began = _held_by(await (await conn.execute(*_lease_check(q, step.task))).fetchone(), step.task)
        if began is None:
            await conn.rollback()
            return False
        result = await step.async_work(conn)
        failed = failed_transaction(conn.info.transaction_status)
        if failed is not None:
            raise failed
        try:
            outcomes = [ActivityOutcome(task=step.task, result=result)]
            # the reads the completion decides on, with the transaction's id: one round trip
            async with conn.pipeline():
                current = await conn.execute(CURRENT_TRANSACTION)
                live, leases = [await conn.execute(*read) for read in activity_tasks.completion_reads(q, outcomes)]
            if _xid(await current.fetchone()) != began:
                raise ended_by_the_function(step.task.name)
            applied, writes = activity_tasks.completion_writes(
                q, outcomes, await live.fetchall(), await leases.fetchall(), clock.now()
            )
            _check_applied(applied, step)
            async with conn.pipeline():  # the writes and the commit: one round trip
                for query, params in writes:
                    await conn.execute(query, params)
                await conn.commit()
        except psycopg.Error as exc:
            if statement_error(conn, exc):
                raise StepFailed(exc) from None
            raise
        return True
    except BaseException:
        if not conn.closed:
            try:
                await conn.rollback()
            except Exception:  # noqa: BLE001 - the connection is closed next; the server rolls back
                pass
        raise


def caller_connection(connection: object, parameter: str = "connection") -> Any:
    """The application's connection as the adapter's SQL functions use it: a
    ``psycopg.Connection`` as it is, an ``AsyncConnection`` (from the asyncio facade) bridged
    to its loop. TypeError for anything else; ValueError for a closed or failed one."""
    if isinstance(connection, LoopConnection):
        conn = connection.connection
        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(f"{parameter} must be a psycopg.AsyncConnection here, got {type(conn).__name__}")
        loop = connection.loop

        def run(coro: Coroutine[Any, Any, Any]) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        _check_usable(conn, parameter)
        return LoopBridge(conn, run)
    if not isinstance(connection, psycopg.Connection):
        raise TypeError(f"{parameter} must be a psycopg.Connection, got {type(connection).__name__}")
    _check_usable(connection, parameter)
    return connection


def _check_usable(conn: psycopg.Connection | psycopg.AsyncConnection, parameter: str) -> None:
    if conn.closed or conn.broken:
        raise ValueError(f"{parameter} is closed: give an open connection in the transaction to write through")
    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
        raise ValueError(f"{parameter} is in a failed transaction: roll it back first")
