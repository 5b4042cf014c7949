"""PostgresAdapter: every port of :mod:`dex.app.ports` over a PostgreSQL schema.

Each method is one short transaction on a pooled connection: a single statement in the pool's autocommit
mode, or a ``conn.transaction()`` block (commits when the block ends, rolls back on an exception). The SQL
lives in one module per concern; this class owns the pool, the clock and the cache of queues known to exist.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta

import psycopg
from psycopg_pool import PoolTimeout

from dex.adapters.postgres import (
    activity_outcomes,
    activity_tasks,
    dispatch,
    forks,
    queues,
    runs,
    workflow_tasks,
)
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.connection import (
    DatabaseConnectionError,
    KeptConnection,
    connect,
    describe_dsn,
    open_pool,
    prepare_conninfo,
)
from dex.adapters.postgres.refusals import refusals
from dex.adapters.postgres.remote_tasks import PostgresRemoteTasks
from dex.adapters.postgres.schema import Statements, migrate
from dex.adapters.postgres.sessions import (
    IDLE_IN_TRANSACTION_TIMEOUT,
    STATEMENT_TIMEOUT,
    restore_query,
    session_restore,
    session_settings,
    settings_query,
)
from dex.adapters.postgres.step_sessions import StepSessions
from dex.adapters.postgres.step_slots import StepSlots
from dex.adapters.postgres.step_store import PostgresTransactionSteps
from dex.app.clock import SystemClock
from dex.app.ports import (
    ACTIVITY,
    WORKFLOW,
    ActivityOutcome,
    ActivitySlots,
    ActivityTask,
    Claim,
    Clock,
    Loaded,
    QueueInfo,
    RunFilter,
    RunRecord,
    WorkflowTask,
)
from dex.domain import events as ev
from dex.domain.errors import DexError
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo
from dex.serialization.history import decode_block
from dex.views.secrets import redact_dsn


class PostgresAdapter(forks.PostgresForks, PostgresRemoteTasks, PostgresTransactionSteps):
    """A store in PostgreSQL; several adapters (in one or many processes) may share a schema.

    ``dsn`` is a libpq connection string or URL. The schema is created or upgraded on
    construction (``migrate=False`` skips that). Times come from the callers' ``now``
    arguments, which engines take from ``clock``, so a VirtualClock works here too.

    Connections come from a pool of ``min_connections`` to ``max_connections``. A started
    engine uses at most one per background thread at a time (five: scheduler, workflow
    worker, activity worker, and two flushers, one for activity outcomes and heartbeats, one
    for events and workflow results, each writing in batches), plus one per call of its API
    (``start_workflow``, ``wait``, ...) that the application makes at the same moment; the
    default of 10 covers the threads with room for five concurrent callers (once the
    application has started a run, one of them stays with the adapter for starts:
    :class:`~dex.adapters.postgres.connection.KeptConnection`). A caller waits up
    to ``pool_timeout`` (30 s) for a free connection. Raise ``max_connections`` for more
    concurrent callers; mind the server's ``max_connections`` (100 by default) across all
    processes.

    Transaction steps (``@dex.transaction``) run on connections of their own, outside the pool:
    at most ``step_connections`` (default 4) attempts at once, each holding one while its
    function runs; a step waits up to ``pool_timeout`` for one to come free. Up to as many again
    are kept open between steps, for synchronous steps and for ``async def`` ones each. An
    attempt that runs past its ``lock_timeout`` has its session ended, and gives up its place
    at once even if its code never returns (``Engine.health().lost_step_slots`` counts those
    still running).

    Each pooled session runs with ``statement_timeout`` (default 30 s: every statement here
    takes milliseconds) and ``idle_in_transaction_session_timeout`` (default 60 s: the adapter
    never pauses inside a transaction, so a session idle in one belongs to a stuck process and
    its row locks are released). A zero timedelta turns a limit off.

    If the server restarts, connections it closed are replaced when the pool hands them out;
    a statement under way fails with ``psycopg.OperationalError``, which the engine's
    background threads log before backing off. While the server is down, callers wait for a
    connection (up to ``pool_timeout``) and then get :class:`DatabaseConnectionError`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "dex",
        clock: Clock | None = None,
        min_connections: int = 1,
        max_connections: int = 10,
        connect_timeout: float = 5,
        pool_timeout: float = 30,
        statement_timeout: timedelta = STATEMENT_TIMEOUT,
        idle_in_transaction_timeout: timedelta = IDLE_IN_TRANSACTION_TIMEOUT,
        step_connections: int = 4,
        migrate: bool = True,
    ) -> None:
        if not isinstance(step_connections, int) or isinstance(step_connections, bool) or step_connections < 1:
            raise ValueError(f"step_connections must be an integer of at least 1, got {step_connections!r}")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._q = Statements(schema)
        self._create_run = runs.create_run_statement(self._q)
        conninfo = prepare_conninfo(dsn, connect_timeout)
        # one plain connection first: a bad DSN or a server that is down fails here, at once
        with connect(conninfo) as conn:
            if migrate:
                _migrate(conn, schema)
        self._pool = open_pool(
            conninfo,
            min_size=min_connections,
            max_size=max_connections,
            timeout=connect_timeout + 5,
            wait_timeout=pool_timeout,
            name=f"dex-{schema}",
            configure=session_settings(statement_timeout, idle_in_transaction_timeout),
        )
        self._kept = KeptConnection(self._pool)  # one session for the application's starts
        self._conninfo = conninfo
        # transaction steps: their slots and their own connections, kept between steps (a step's
        # function may change its session: it is restored before the next step has it)
        self._step_slots = StepSlots(step_connections, pool_timeout)
        self._step_sessions = StepSessions(
            conninfo,
            settings_query(statement_timeout, idle_in_transaction_timeout),
            session_restore(statement_timeout, idle_in_transaction_timeout),
            keep=step_connections,
        )
        self._async_sessions = AsyncSessions(
            conninfo,
            settings_query(statement_timeout, idle_in_transaction_timeout),
            restore_query(statement_timeout, idle_in_transaction_timeout),
            keep=step_connections,
        )
        self._where = describe_dsn(conninfo)
        self._shown_dsn = redact_dsn(dsn)  # what repr shows: never the password
        self._known_queues: set[tuple[str, str]] = set()
        self._known_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PostgresAdapter({self._shown_dsn!r}, schema={self._q.schema!r})"

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def schema(self) -> str:
        return self._q.schema

    def close(self) -> None:
        """Close the pool's connections (idempotent)."""
        self._kept.release()
        self._step_sessions.close()
        self._async_sessions.close()
        self._pool.close()

    @contextmanager
    def _statement(self, kept: bool = False) -> Iterator[psycopg.Connection]:
        """A connection for operations that are one statement: the pool's connections are in
        autocommit, so no BEGIN and COMMIT round trips go around it (a single statement is
        atomic on its own). With ``kept``, the connection kept for starts (KeptConnection)."""
        try:
            with self._kept.connection() if kept else self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise DatabaseConnectionError(f"no connection to PostgreSQL at {self._where}: {exc}") from None

    def reading(self) -> AbstractContextManager[psycopg.Connection]:
        """A connection of the pool (autocommit: each statement a transaction of its own) for
        reads of dex's own modules that have no port, such as the dashboard's insights
        (``dex.web.pg_insights``). ``DatabaseConnectionError`` if none comes free."""
        return self._statement()

    @contextmanager
    def _transaction(self, pipeline: bool = False) -> Iterator[psycopg.Connection]:
        """A transaction; with ``pipeline``, statements whose results are not read are sent
        without waiting for each answer (psycopg's pipeline mode: fewer network round trips)."""
        with self._connection() as conn, dispatch.begin(conn, pipeline):
            yield conn

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, for a transaction (:func:`.dispatch.begin`) and what is read after it."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            # no connection came free, or none could be made: the server is down or overloaded
            raise DatabaseConnectionError(f"no connection to PostgreSQL at {self._where}: {exc}") from None

    # -- runs ------------------------------------------------------------------------------
    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        self._ensure_queues([(created.queue, WORKFLOW)])
        with self._statement(kept=True) as conn:  # one statement per attempt; see runs.create_run
            return runs.create_run(conn, self._q, self._create_run, run_id, created, now)[0]

    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        self._ensure_queues([(created.queue, WORKFLOW)])
        with self._statement(kept=True) as conn:
            return runs.create_run(conn, self._q, self._create_run, run_id, created, now, claim)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._statement() as conn:
            return runs.get_run(conn, self._q, run_id)

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        if not run_ids:
            return []
        with self._statement() as conn:
            return runs.get_runs(conn, self._q, run_ids)

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        with self._statement() as conn:
            return runs.list_runs(conn, self._q, run_filter)

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        with self._statement() as conn:
            encoded = runs.load_history(conn, self._q, run_id)
        return [event for data in encoded for event in decode_block(data)]

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        if limit <= 0:
            return []
        after_seq, limit = max(-1, min(after_seq, 2**62)), min(limit, 2**31)  # no sum leaves a bigint
        with self._statement() as conn:
            encoded = runs.load_history_after(conn, self._q, run_id, after_seq, limit)
        events = (event for data in encoded for event in decode_block(data))
        return [event for event in events if event.sequence_number > after_seq][:limit]

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        with self._transaction() as conn:
            runs.send_message(conn, self._q, run_id, message, now)

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        with refusals(), self._transaction() as conn:
            return runs.send_messages(conn, self._q, list(items), now)

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        with self._transaction() as conn:
            runs.request_transition(conn, self._q, run_id, target, message, now)

    # -- workflow tasks ----------------------------------------------------------------------
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        with self._transaction() as conn:
            return workflow_tasks.schedule_workflow_tasks(conn, self._q, now, limit)

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        with self._statement() as conn:
            return workflow_tasks.claim_workflow_tasks(conn, self._q, names, owner, now, lease, limit)

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        with self._statement() as conn:
            return workflow_tasks.load_workflow_task(conn, self._q, task, now, after_seq)

    def load_workflow_tasks(self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime) -> list[Loaded]:
        with self._statement() as conn:
            return workflow_tasks.load_workflow_tasks(conn, self._q, requests, now)

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        return self._complete_workflow_tasks(results, now, None)[0]

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        return self._complete_workflow_tasks(results, now, claim)

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        if not retries:
            return []
        with self._statement() as conn:
            return workflow_tasks.retry_workflow_tasks(conn, self._q, retries, failure)

    def _complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim | None
    ) -> tuple[list[bool], list[ActivityTask]]:
        # queues the results start using get their rows and partitions first, in transactions
        # of their own (DDL), so that the batch itself only inserts rows
        needed = [(spec.queue, ACTIVITY) for _, result in results for spec in result.activity_tasks]
        needed += [(child.created.queue, WORKFLOW) for _, result in results for child in result.child_runs]
        with refusals():  # the buffer splits a refused batch; see refusals.py
            self._ensure_queues(needed)
            return self._complete_workflow_tasks_in_one(results, now, claim)

    def _complete_workflow_tasks_in_one(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim | None
    ) -> tuple[list[bool], list[ActivityTask]]:
        with self._connection() as conn:
            return dispatch.complete_workflow_tasks_then_claim(conn, self._q, results, now, claim)

    # -- activity tasks ------------------------------------------------------------------------
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        with self._transaction() as conn:
            return activity_tasks.schedule_activity_tasks(conn, self._q, now, limit)

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        with self._statement() as conn:
            return activity_tasks.claim_activity_tasks(conn, self._q, names, owner, now, lease, limit)

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        with refusals(), self._statement() as conn:
            return activity_tasks.extend_activity_leases(conn, self._q, tasks, now, lease)

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        return self._complete_activity_tasks(outcomes, now, None)[0]

    def complete_activity_tasks_then_claim(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        return self._complete_activity_tasks(outcomes, now, claim)

    def _complete_activity_tasks(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim | None
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        if activity_outcomes.all_finished(outcomes):  # one call of the schema's function
            with refusals(), self._statement() as conn:
                return activity_outcomes.complete_finished(conn, self._q, outcomes, now, claim)
        with refusals(), self._connection() as conn:  # see refusals.py
            return dispatch.complete_activity_tasks_then_claim(conn, self._q, outcomes, now, claim)

    # -- queues ------------------------------------------------------------------------------
    def _ensure_queues(self, wanted: Iterable[tuple[str, str]]) -> None:
        with self._known_lock:
            missing = sorted(set(wanted) - self._known_queues)
        for name, kind in missing:
            self.ensure_queue(name, kind)

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        queues.check_queue(name, kind, capacity)
        with self._known_lock:
            if (name, kind) in self._known_queues:
                return
        with self._transaction() as conn:
            queues.ensure_queue(conn, self._q, name, kind, capacity)
        with self._known_lock:  # queues are never deleted, so once known, always known
            self._known_queues.add((name, kind))

    def create_queue(self, name: str, kind: str, capacity: int) -> None:
        queues.check_queue(name, kind, capacity)
        with self._transaction() as conn:
            queues.create_queue(conn, self._q, name, kind, capacity)
        with self._known_lock:
            self._known_queues.add((name, kind))

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        queues.check_queue(name, kind, 1)
        with self._transaction() as conn:
            queues.update_queue(conn, self._q, name, kind, "paused", bool(paused))

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        queues.check_queue(name, kind, capacity)
        with self._transaction() as conn:
            queues.update_queue(conn, self._q, name, kind, "capacity", capacity)

    def list_queues(self) -> list[QueueInfo]:
        with self._statement() as conn:
            return queues.list_queues(conn, self._q)

    def activity_slots(self) -> list[ActivitySlots]:
        with self._statement() as conn:
            return queues.activity_slots(conn, self._q)

    # -- leadership and maintenance -------------------------------------------------------------
    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        with self._statement() as conn:
            return queues.try_lead(conn, self._q, node_id, now, ttl)

    def release_leadership(self, node_id: str) -> None:
        with self._transaction() as conn:
            queues.release_leadership(conn, self._q, node_id)

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        with self._transaction() as conn:
            return runs.delete_finished_runs(conn, self._q, completed_before, limit)

    def next_due_time(self, now: datetime) -> datetime | None:
        with self._statement() as conn:
            return queues.next_due_time(conn, self._q, now)


def _migrate(conn: psycopg.Connection, schema: str) -> None:
    migrate(conn, schema)
    conn.commit()
