"""PostgresAdapter: every port of :mod:`dex.app.ports.store` over a PostgreSQL schema.

The adapter is composed of parts, each given what it uses when it is made: the connections
(:class:`~.database.Database`), the schema's statements, the start statement and the cache of
queues known to exist (:class:`~.queues.PostgresQueues`). Runs are :class:`~.runs.PostgresRuns`, starts by an instance id used before
:class:`~.instance_keys.PostgresKeyedStarts`;
the task queues :class:`~.tasks.PostgresWorkflowTasks` and :class:`~.tasks.PostgresActivityTasks`;
schedules :class:`~.schedules.PostgresSchedules`; update answers :class:`~.updates.PostgresUpdates`; the engine registry :class:`~.engines.PostgresEngines`;
published values and streams :class:`~.streams.PostgresStreams`; forks :class:`~.forks.PostgresForks`; transaction
steps :class:`~.step_store.PostgresTransactionSteps`. The adapter builds them, holds them and implements each port by one
call of the part that owns it. Each port call is one short transaction on a pooled connection: a
single statement in the pool's autocommit mode, or a ``conn.transaction()`` block.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta

import psycopg

from dex.adapters.postgres import at_call, runs
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.connection import KeptConnection, connect, describe_dsn, open_pool, prepare_conninfo
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.engines import PostgresEngines
from dex.adapters.postgres.forks import PostgresForks
from dex.adapters.postgres.instance_keys import PostgresKeyedStarts
from dex.adapters.postgres.outbox import PostgresOutbox
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.rate_limits import LimitedQueues, Reservations, read_limited_queues
from dex.adapters.postgres.runs import PostgresRuns
from dex.adapters.postgres.schedules import PostgresSchedules
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
from dex.adapters.postgres.streams import PostgresStreams
from dex.adapters.postgres.tasks import PostgresActivityTasks, PostgresWorkflowTasks
from dex.adapters.postgres.update_answers import answer_channel
from dex.adapters.postgres.updates import AnswerListener, PostgresUpdates
from dex.app.ports.clock import SystemClock
from dex.app.ports.endings import Decide
from dex.app.ports.engines import EngineInfo
from dex.app.ports.notices import TaskNotices
from dex.app.ports.schedules import ScheduleAdvance, ScheduleDefinition, ScheduledStart, ScheduleRecord
from dex.app.ports.store import (
    ActivityOutcome,
    ActivitySlots,
    ActivityTask,
    Claim,
    Clock,
    Loaded,
    QueueInfo,
    RunFilter,
    RunRecord,
    StepAttempts,
    StepEndings,
    TransactionStep,
    WorkflowTask,
)
from dex.app.ports.streams import PublishedRead, RunStreams, StreamPage
from dex.app.ports.transactions import CheckpointOutcome, StepCheckpoint
from dex.domain import events as ev
from dex.domain.errors import DexError
from dex.domain.forks import Fork
from dex.domain.instance_keys import StartRule
from dex.domain.queue_limits import RateLimit
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, UpdateAnswer, WorkflowTaskResult
from dex.domain.values import FailureInfo, Payload
from dex.views.secrets import redact_dsn


class PostgresAdapter:
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
        self._q = q = Statements(schema)
        create_statement = runs.create_run_statement(q)
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
        self._db = db = Database(self._pool, self._kept, describe_dsn(conninfo))
        self._shown_dsn = redact_dsn(dsn)  # what repr shows: never the password
        # transaction steps: their slots and their own connections, kept between steps (a step's
        # function may change its session: it is restored before the next step has it)
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
        limited = LimitedQueues(functools.partial(read_limited_queues, db, q))
        reservations = Reservations()  # the starts this engine reserved ahead, for its claims
        self._queues = queues = PostgresQueues(db, q, limited)
        self._engines = PostgresEngines(db, q)
        self._outbox = PostgresOutbox(db, q)
        self._streams = PostgresStreams(db, q)
        self._runs = PostgresRuns(db, q, create_statement, queues)
        self._keyed = PostgresKeyedStarts(db, q, create_statement, queues)
        self._workflow_tasks = PostgresWorkflowTasks(db, q, queues, limited, reservations)
        self._activity_tasks = PostgresActivityTasks(db, q, limited, reservations)
        self._schedules = PostgresSchedules(db, q, create_statement, queues)
        self._forks = PostgresForks(db, q, queues)
        # engine.update's callers wait for their answers on a LISTEN of its own (updates.py)
        self._answer_listener = AnswerListener(conninfo, answer_channel(q.schema))
        self._updates = PostgresUpdates(db, q, self._answer_listener)
        self._steps = PostgresTransactionSteps(
            q,
            create_statement,
            queues,
            clock=self._clock,
            conninfo=conninfo,
            step_slots=StepSlots(step_connections, pool_timeout),
            step_sessions=self._step_sessions,
            async_sessions=self._async_sessions,
        )

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
        self._answer_listener.close()
        self._kept.release()
        self._step_sessions.close()
        self._async_sessions.close()
        self._pool.close()

    # -- the event-driven dispatch mode (docs/reference/contract.md §16) ----------------------
    def set_dispatch(self, mode: str) -> None:
        """Make the database write task notices (``"kafka"``) or not (``"polling"``)."""
        self._outbox.set_dispatch(mode)

    @property
    def outbox(self) -> PostgresOutbox:
        """The outbox of the Kafka mode (read-only; for its relay and tests)."""
        return self._outbox

    def task_notices(self, config: Mapping[str, object]) -> TaskNotices:
        """The notices of ``Engine(dispatch="kafka", kafka=config)`` (the ``kafka`` extra)."""
        from dex.adapters.kafka.notices import KafkaNotices
        from dex.adapters.kafka.settings import kafka_settings

        return KafkaNotices(self._outbox, kafka_settings(config, self._q.schema))

    def reading(self) -> AbstractContextManager[psycopg.Connection]:
        """A connection of the pool (autocommit: each statement a transaction of its own) for
        reads of dex's own modules that have no port, such as the dashboard's insights
        (``dex.web.pg_insights``). ``DatabaseConnectionError`` if none comes free."""
        return self._db.statement()

    # -- runs ------------------------------------------------------------------------------
    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        return self._runs.create_run(run_id, created, now)

    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        return self._runs.create_run_then_claim(run_id, created, now, claim)

    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        return self._keyed.start_keyed_run(run_id, created, now, rule, connection)

    def get_run(self, run_id: str) -> RunRecord | None:
        return self._runs.get_run(run_id)

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        return self._runs.get_runs(run_ids)

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        return self._runs.list_runs(run_filter)

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        return self._runs.load_history(run_id)

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        return self._runs.load_history_after(run_id, after_seq, limit)

    def history_bounds(self, run_id: str) -> tuple[int, int]:
        return self._runs.history_bounds(run_id)

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        self._runs.send_message(run_id, message, now)

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        return self._runs.send_messages(items, now)

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        self._runs.request_transition(run_id, target, message, now)

    # -- update answers (docs/reference/contract.md §14) --------------------------------------------------
    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        return self._updates.request_update(run_id, request, now)

    def request_update_then_claim(
        self, run_id: str, request: ev.UpdateRequested, now: datetime, claim: Claim
    ) -> tuple[UpdateAnswer | None, list[WorkflowTask], list[Loaded]]:
        return self._updates.request_update_then_claim(run_id, request, now, claim)

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        return self._updates.update_answer(run_id, update_id)

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        return self._updates.wait_update_answer(run_id, update_id, timeout)

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        return self._runs.delete_finished_runs(completed_before, limit)

    def end_run(self, run_id: str, decide: Decide, now: datetime) -> bool:
        return at_call.end_run(self._db, self._q, run_id, decide, now)

    def create_fork(self, fork: Fork, now: datetime) -> str:
        return self._forks.create_fork(fork, now)

    # -- workflow tasks ----------------------------------------------------------------------
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        return self._workflow_tasks.schedule_workflow_tasks(now, limit)

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        return self._workflow_tasks.claim_workflow_tasks(names, owner, now, lease, limit)

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        return self._workflow_tasks.load_workflow_task(task, now, after_seq)

    def load_workflow_tasks(self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime) -> list[Loaded]:
        return self._workflow_tasks.load_workflow_tasks(requests, now)

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        return self._workflow_tasks.complete(results, now, None)[0]

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        return self._workflow_tasks.complete(results, now, claim)

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        return self._workflow_tasks.retry_workflow_tasks(retries, now, failure)

    # -- activity tasks ------------------------------------------------------------------------
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        return self._activity_tasks.schedule_activity_tasks(now, limit)

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        return self._activity_tasks.claim_activity_tasks(names, owner, now, lease, limit)

    def step_attempts(self, run_id: str, created_seqs: Collection[int] | None = None) -> list[StepAttempts]:
        return self._activity_tasks.step_attempts(run_id, created_seqs)

    def step_endings(self, run_id: str, created_seqs: Collection[int], after_seq: int, limit: int) -> StepEndings:
        return self._runs.step_endings(run_id, created_seqs, after_seq, limit)

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        return self._activity_tasks.find_activity_tasks(task_ids)

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        return self._activity_tasks.extend_activity_leases(tasks, now, lease)

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        return self._activity_tasks.complete(outcomes, now, None)[0]

    def complete_activity_tasks_then_claim(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        return self._activity_tasks.complete(outcomes, now, claim)

    # -- transaction steps ---------------------------------------------------------------------
    @property
    def lost_step_slots(self) -> int:
        return self._steps.lost_step_slots

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        return self._steps.complete_in_transaction(step)

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        return self._steps.checkpoint_steps(items, now)

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        return self._steps.create_run_in(connection, run_id, created, now)

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        self._steps.send_message_in(connection, run_id, message, now)

    # -- schedules -----------------------------------------------------------------------------
    def create_schedule(self, record: ScheduleRecord) -> None:
        self._schedules.create_schedule(record)

    def update_schedule(
        self, definition: ScheduleDefinition, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        self._schedules.update_schedule(definition, next_fire_at, due_at)

    def delete_schedule(self, name: str) -> None:
        self._schedules.delete_schedule(name)

    def set_schedule_paused(
        self, name: str, paused: bool, note: str, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        self._schedules.set_schedule_paused(name, paused, note, next_fire_at, due_at)

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        return self._schedules.get_schedule(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        return self._schedules.list_schedules()

    def due_schedules(self, now: datetime, limit: int) -> tuple[list[ScheduleRecord], datetime | None]:
        return self._schedules.due_schedules(now, limit)

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        return self._schedules.advance_schedule(advance, now)

    def trigger_schedule(self, name: str, start: ScheduledStart, now: datetime) -> str:
        return self._schedules.trigger_schedule(name, start, now)

    # -- queues, leadership and maintenance -----------------------------------------------------
    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        self._queues.ensure_queue(name, kind, capacity)

    def create_queue(
        self, name: str, kind: str, capacity: int, key_concurrency: int = 1, rate_limit: RateLimit | None = None
    ) -> None:
        self._queues.create_queue(name, kind, capacity, key_concurrency, rate_limit)

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        self._queues.set_queue_paused(name, kind, paused)

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        self._queues.set_queue_capacity(name, kind, capacity)

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        self._queues.set_queue_key_concurrency(name, kind, key_concurrency)

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: RateLimit | None) -> None:
        self._queues.set_queue_rate_limit(name, kind, rate_limit)

    def list_queues(self) -> list[QueueInfo]:
        return self._queues.list_queues()

    def activity_slots(self) -> list[ActivitySlots]:
        return self._queues.activity_slots()

    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        return self._queues.try_lead(node_id, now, ttl)

    def release_leadership(self, node_id: str) -> None:
        self._queues.release_leadership(node_id)

    def next_due_time(self, now: datetime) -> datetime | None:
        return self._queues.next_due_time(now)

    def heartbeat_engine(self, info: EngineInfo, now: datetime, expires_at: datetime) -> None:
        self._engines.heartbeat_engine(info, now, expires_at)

    def remove_engine(self, node_id: str) -> None:
        self._engines.remove_engine(node_id)

    def list_engines(self, now: datetime) -> list[EngineInfo]:
        return self._engines.list_engines(now)

    def read_published(self, run_id: str, key: str) -> PublishedRead:
        return self._streams.read_published(run_id, key)

    def read_stream(self, run_id: str, key: str, after: int, limit: int) -> StreamPage:
        return self._streams.read_stream(run_id, key, after, limit)

    def run_streams(self, run_id: str) -> RunStreams:
        return self._streams.run_streams(run_id)

    def write_stream_items(self, run_id: str, items: Sequence[tuple[str, Payload]], now: datetime) -> None:
        self._streams.write_stream_items(run_id, items, now)


def _migrate(conn: psycopg.Connection, schema: str) -> None:
    migrate(conn, schema)
    conn.commit()
