"""The PostgreSQL adapter's transaction steps and transactional starts (docs/reference/contract.md §9): a part of
:class:`dex.adapters.postgres.PostgresAdapter` that uses its statements, clock, step slots and
step connections. The SQL is in :mod:`~dex.adapters.postgres.transactions` (a step as a task
of its own, and the application's connection) and :mod:`~dex.adapters.postgres.checkpoints`
(steps run inside their workflow tasks, a group per transaction).

Each attempt (or group) holds a slot (:mod:`.step_slots`) and a connection of the steps' own
(:mod:`.step_sessions`, :mod:`.async_sessions`), and is watched for its ``lock_timeout``
(:mod:`.overruns`). When the watch ends its session, the slot is lost: free for the next step
while the attempt's code may still run; whatever it returns then is dropped
(:func:`_as_the_store_runs_it`). The step's function holds its connection while it runs
(:mod:`.step_connections`): ending the transaction is refused, and what it set on the
connection is set back before dex's statements run on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg

from dex.adapters.postgres import checkpoints, direct, instances, overruns, runs, transactions
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.schema import Statements
from dex.adapters.postgres.step_connections import run_held, run_held_async
from dex.adapters.postgres.step_sessions import StepSessions
from dex.adapters.postgres.step_slots import Slot, StepSlots
from dex.app.ports.store import ACTIVITY, WORKFLOW, Clock, TransactionStep
from dex.app.ports.transactions import CheckpointOutcome, StepCheckpoint, StepFailed
from dex.domain import events as ev
from dex.domain.values import Payload


class PostgresTransactionSteps:
    """Transaction steps (``@dex.transaction``) and ``connection=`` starts and events.

    Made with what they use: the schema's statements, the adapter's start statement
    (``create_statement``, for ``create_run_in``) and cache of queues, the clock, the
    ``conninfo`` the overrun watch connects with to end a session, the step slots, and the
    steps' own connections, synchronous and async."""

    def __init__(
        self,
        q: Statements,
        create_statement: direct.DirectStatement,
        queues: PostgresQueues,
        *,
        clock: Clock,
        conninfo: str,
        step_slots: StepSlots,
        step_sessions: StepSessions,
        async_sessions: AsyncSessions,
    ) -> None:
        self._q, self._create_run, self._queues = q, create_statement, queues
        self._clock, self._conninfo = clock, conninfo
        self._step_slots, self._step_sessions, self._async_sessions = step_slots, step_sessions, async_sessions

    @property
    def lost_step_slots(self) -> int:
        return self._step_slots.lost

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        try:
            with self._step_slots.held() as slot:
                step = _as_the_store_runs_it(step, slot)
                if step.async_work is not None:
                    return transactions.complete_async(
                        self._async_sessions,
                        self._q,
                        self._clock,
                        step,
                        lambda pid: self._watched(pid, slot, overruns.of_task(step.task)),
                    )
                # the attempt is bounded by its lock_timeout (overruns.py); the watch ends, and
                # the session is given back what the function changed (sessions.py), before the
                # connection is kept for the next step
                conn = self._step_sessions.take()
                try:
                    with self._watched(conn.info.backend_pid, slot, overruns.of_task(step.task)):
                        return transactions.complete_sync(conn, self._q, self._clock, step)
                finally:
                    self._step_sessions.give_back(conn)
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as exc:
            # 40001 / 40P01 wherever they came (the commit of a SERIALIZABLE step, say): the
            # step's own conflict with other transactions, a failed attempt retried by its policy
            raise StepFailed(exc) from None

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        if not items:
            return []
        # the queues the results start using get their rows first, as completions' do (DDL)
        wanted = [(spec.queue, ACTIVITY) for item in items for spec in item.result.activity_tasks]
        wanted += [(child.created.queue, WORKFLOW) for item in items for child in item.result.child_runs]
        self._queues.ensure_all(wanted)
        # bounded as a step run on its own is (overruns.py): an overrun fails the group, whose
        # steps then run as tasks of their own, each watched
        steps = [item.step for item in items]
        with self._step_slots.held() as slot:
            items = [attrs.evolve(item, work=_checked(item.work, item.step.name, slot)) for item in items]
            conn = self._step_sessions.take()
            try:
                with self._watched(conn.info.backend_pid, slot, overruns.of_group(steps)):
                    return checkpoints.in_transaction(conn, self._q, items, now)
            finally:
                self._step_sessions.give_back(conn)  # as a step's, above

    def _watched(
        self, pid: int, slot: Slot, watch: tuple[timedelta, str, str | None]
    ) -> AbstractContextManager[overruns.Overrun]:
        """The attempt on session ``pid`` watched for ``watch`` (its limit, name and run:
        overruns.of_task, of_group); its slot lost when its session is ended."""
        limit, what, run_id = watch
        return overruns.watched(self._conninfo, pid, limit, what, run_id, lost=slot.lose)

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        conn = transactions.caller_connection(connection)
        self._queues.ensure_all([(created.queue, WORKFLOW)])
        if created.instance_id is not None:  # held until the application's transaction ends (instances.py)
            instances.hold(conn, self._q, created.instance_id)
        return runs.create_run(conn, self._q, self._create_run, run_id, created, now, public=True)[0]

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        runs.send_message(transactions.caller_connection(connection), self._q, run_id, message, now, in_caller=True)


def _as_the_store_runs_it(step: TransactionStep, slot: Slot) -> TransactionStep:
    """``step`` whose work holds its connection while the function runs (:mod:`.step_connections`)
    and, once it returns, raises :class:`~.step_slots.AttemptLost` if its slot was lost meanwhile
    (its session was ended at its lock_timeout): a result that comes after the lease was lost is
    dropped, whether or not the session's end reached it (the watch that ends the session turns
    the error into the attempt's ``TimeoutError``)."""
    if step.work is not None:
        return attrs.evolve(step, work=_checked(step.work, step.task.name, slot))
    async_work = step.async_work
    if async_work is None:
        return step

    async def checked(conn: Any) -> Payload:
        result = await run_held_async(conn, step.task.name, async_work)
        slot.check()
        return result

    return attrs.evolve(step, async_work=checked)


def _checked(work: Callable[[Any], Payload], name: str, slot: Slot) -> Callable[[Any], Payload]:
    def checked(conn: Any) -> Payload:
        result = run_held(conn, name, work)
        slot.check()
        return result

    return checked
