"""The PostgreSQL adapter's transaction steps and transactional starts (SPEC §9): a part of
:class:`dex.adapters.postgres.PostgresAdapter` that uses its pool, statements and clock. The
SQL is in :mod:`~dex.adapters.postgres.transactions` (a step as a task of its own, and the
application's connection) and :mod:`~dex.adapters.postgres.checkpoints` (steps run inside
their workflow tasks, a group per transaction)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime

import psycopg

from dex.adapters.postgres import checkpoints, instances, overruns, runs, transactions
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.schedules import PostgresSchedules
from dex.app.ports import ACTIVITY, WORKFLOW, Clock, TransactionStep
from dex.app.transaction_ports import CheckpointOutcome, StepCheckpoint, StepFailed
from dex.domain import events as ev


class PostgresTransactionSteps(PostgresSchedules):
    """Transaction steps (``@dex.transaction``) and ``connection=`` starts and events."""

    _clock: Clock
    _conninfo: str
    _async_sessions: AsyncSessions
    _step_slots: threading.BoundedSemaphore
    _restore_session: Callable[[psycopg.Connection], None]  # sessions.session_restore

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        try:
            with self._step_slots:
                if step.async_work is not None:
                    return transactions.complete_async(
                        self._async_sessions,
                        self._q,
                        self._clock,
                        step,
                        lambda pid: overruns.watched(self._conninfo, pid, *overruns.of_task(step.task)),
                    )
                # the attempt is bounded by its lock_timeout (overruns.py); the watch ends, and
                # the session is given back what the function changed (sessions.py), before the
                # connection goes back to the pool
                with self._statement() as conn:
                    try:
                        with overruns.watched(self._conninfo, conn.info.backend_pid, *overruns.of_task(step.task)):
                            return transactions.complete_sync(conn, self._q, self._clock, step)
                    finally:
                        self._restore_session(conn)
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
        self._ensure_queues(wanted)
        # bounded as a step run on its own is (overruns.py): an overrun fails the group, whose
        # steps then run as tasks of their own, each watched
        steps = [item.step for item in items]
        with self._step_slots, self._statement() as conn:
            try:
                with overruns.watched(self._conninfo, conn.info.backend_pid, *overruns.of_group(steps)):
                    return checkpoints.in_transaction(conn, self._q, items, now)
            finally:
                self._restore_session(conn)  # as a step's, above

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        conn = transactions.caller_connection(connection)
        self._ensure_queues([(created.queue, WORKFLOW)])
        if created.instance_id is not None:  # held until the application's transaction ends (instances.py)
            instances.hold(conn, self._q, created.instance_id)
        return runs.create_run(conn, self._q, self._create_run, run_id, created, now, public=True)[0]

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        runs.send_message(transactions.caller_connection(connection), self._q, run_id, message, now, in_caller=True)
