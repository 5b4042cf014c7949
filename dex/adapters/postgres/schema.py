"""The PostgreSQL schema: versioned migrations, per-queue partitions and statement composition.

Everything lives in one schema (``dex`` unless configured), so several deployments or test
cases can share a database. Migrations are numbered; ``schema_version`` records the applied
ones, and :func:`migrate` applies the missing ones under a transaction-scoped advisory lock,
so that engines starting together serialise instead of racing on ``CREATE TABLE``.

Identifiers (the schema, partition names) only ever reach SQL through
:class:`psycopg.sql.Identifier`, values through parameters or :class:`psycopg.sql.Literal`.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from dex.adapters.postgres.connection import connect, prepare_conninfo
from dex.domain.definitions import validate_queue
from dex.domain.errors import DexError

# Status lists are spelled out literally (not passed as parameters) wherever a partial index
# must match: the planner can only use a partial index whose predicate the query implies.
LIVE = "('CREATED', 'RUNNING', 'SUSPENDED')"
TERMINAL = "('COMPLETED', 'FAILED', 'CANCELLED')"

# advisory lock classes (first key of pg_advisory_xact_lock(int, int)); the second key is the
# hash of the schema name, so two schemas in one database do not wait for each other
LOCK_MIGRATE = 0x0DE1
LOCK_SCHEDULE_WORKFLOWS = 0x0DE2
LOCK_SCHEDULE_ACTIVITIES = 0x0DE3

PARTITIONED_TABLES = {"workflow": "workflow_tasks", "activity": "activity_tasks"}

_V1 = [
    """
    CREATE TABLE {s}.queues (
        kind text COLLATE "C" NOT NULL CHECK (kind IN ('workflow', 'activity')),
        name text COLLATE "C" NOT NULL,
        capacity integer NOT NULL CHECK (capacity > 0),
        paused boolean NOT NULL DEFAULT false,
        PRIMARY KEY (kind, name)
    )
    """,
    """
    CREATE TABLE {s}.runs (
        run_id text COLLATE "C" PRIMARY KEY,
        -- creation order: breaks ties between runs created at the same instant
        position bigint GENERATED ALWAYS AS IDENTITY,
        workflow_name text COLLATE "C" NOT NULL,
        queue text COLLATE "C" NOT NULL,
        status text NOT NULL CHECK (status IN ('CREATED', 'RUNNING', 'SUSPENDED', 'COMPLETED', 'FAILED', 'CANCELLED')),
        instance_id text COLLATE "C",
        priority integer NOT NULL,
        concurrency_key text COLLATE "C",
        labels jsonb NOT NULL,
        parent_run_id text COLLATE "C",
        created_at timestamptz NOT NULL,
        started_at timestamptz,
        completed_at timestamptz,
        custom_status text,
        result bytea,
        failure bytea,
        -- the run holds its concurrency key from its first workflow task until it ends
        holds_key boolean NOT NULL DEFAULT false,
        -- sequence number of the last history event: completions compare it under the row lock
        last_seq integer NOT NULL
    )
    """,
    # one live run per instance id; a run leaves the index when it ends
    "CREATE UNIQUE INDEX runs_live_instance ON {s}.runs (instance_id) "
    "WHERE instance_id IS NOT NULL AND status IN " + LIVE,
    "CREATE INDEX runs_newest ON {s}.runs (created_at DESC, position DESC)",
    "CREATE INDEX runs_finished ON {s}.runs (completed_at) WHERE status IN " + TERMINAL,
    "CREATE INDEX runs_key_holders ON {s}.runs (concurrency_key) WHERE holds_key",
    "CREATE INDEX runs_labels ON {s}.runs USING gin (labels jsonb_path_ops)",
    """
    CREATE TABLE {s}.history (
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        seq integer NOT NULL,
        event bytea NOT NULL,
        -- a racing duplicate workflow task that got past the last_seq check still loses here
        PRIMARY KEY (run_id, seq)
    )
    """,
    """
    CREATE TABLE {s}.inbox (
        message_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        kind text NOT NULL,
        message bytea NOT NULL,
        visible_from timestamptz NOT NULL
    )
    """,
    "CREATE INDEX inbox_run ON {s}.inbox (run_id, message_id)",
    "CREATE INDEX inbox_visible ON {s}.inbox (visible_from, run_id)",
    """
    CREATE TABLE {s}.workflow_tasks (
        queue text COLLATE "C" NOT NULL,
        task_id bigserial,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        workflow_name text COLLATE "C" NOT NULL,
        priority integer NOT NULL,
        locked_by text,
        locked_until timestamptz,
        lock_version integer NOT NULL DEFAULT 0,
        PRIMARY KEY (queue, task_id),
        UNIQUE (run_id, queue)  -- at most one workflow task per run (a run never changes queue)
    ) PARTITION BY LIST (queue)
    """,
    # completed workflow tasks are deleted, so the table only ever holds live tasks
    "CREATE INDEX workflow_tasks_claim ON {s}.workflow_tasks (priority DESC, task_id)",
    "CREATE INDEX workflow_tasks_lease ON {s}.workflow_tasks (locked_until) WHERE locked_until IS NOT NULL",
    """
    CREATE TABLE {s}.activity_tasks (
        queue text COLLATE "C" NOT NULL,
        task_id bigserial,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        created_seq integer NOT NULL,
        name text COLLATE "C" NOT NULL,
        input bytea NOT NULL,
        priority integer NOT NULL,
        retry_policy bytea NOT NULL,
        lock_timeout interval NOT NULL,
        visible_from timestamptz NOT NULL,
        attempt integer NOT NULL DEFAULT 1,
        -- CREATED: waiting to become visible (first attempt or retry); QUEUED: claimable or claimed
        state text NOT NULL DEFAULT 'CREATED' CHECK (state IN ('CREATED', 'QUEUED')),
        locked_by text,
        locked_until timestamptz,
        lock_version integer NOT NULL DEFAULT 0,
        PRIMARY KEY (queue, task_id)
    ) PARTITION BY LIST (queue)
    """,
    "CREATE INDEX activity_tasks_waiting ON {s}.activity_tasks (priority DESC, task_id) WHERE state = 'CREATED'",
    "CREATE INDEX activity_tasks_due ON {s}.activity_tasks (visible_from) WHERE state = 'CREATED'",
    "CREATE INDEX activity_tasks_claim ON {s}.activity_tasks (priority DESC, task_id) WHERE state = 'QUEUED'",
    "CREATE INDEX activity_tasks_lease ON {s}.activity_tasks (locked_until) WHERE locked_until IS NOT NULL",
    "CREATE INDEX activity_tasks_run ON {s}.activity_tasks (run_id)",
    # UNLOGGED: a lease is worthless after a crash anyway, and renewals then cost no WAL
    """
    CREATE UNLOGGED TABLE {s}.leader (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        node_id text NOT NULL,
        lease_until timestamptz NOT NULL
    )
    """,
]

# (version, statements); append new versions, never edit an applied one
_V2 = [
    # the tracing context of the run an activity task belongs to (JSON of the carrier), so its
    # span joins the run's trace; added to the parent, so every partition gets it
    "ALTER TABLE {s}.activity_tasks ADD COLUMN IF NOT EXISTS trace_context text",
]

_V3 = [
    # No foreign keys to runs: each one cost a check (a lookup and a row lock on runs) per
    # history event, inbox message and task inserted (measured: a start ~0.70 -> ~0.63 ms).
    # Every writer already finds the run under a row lock of its own (completions lock their
    # runs FOR NO KEY UPDATE, senders FOR SHARE, the scheduler chooses only live runs, which
    # retention never deletes), and retention deletes a run's rows itself (runs.delete_finished_runs).
    *(
        f"ALTER TABLE {{s}}.{table} DROP CONSTRAINT IF EXISTS {table}_run_id_fkey"
        for table in ("history", "inbox", "workflow_tasks", "activity_tasks")
    ),
]


def _create_run_function(history_insert: str) -> str:
    """The ``create_run`` function of migration 4, whose history CTE migration 5 changes."""
    return (
        """
    CREATE OR REPLACE FUNCTION {s}.create_run(
        p_run text, p_name text, p_queue text, p_instance text, p_priority integer, p_key text,
        p_labels jsonb, p_parent text, p_now timestamptz, p_event bytea, p_kind text, p_message bytea,
        p_claim boolean, p_owner text, p_until timestamptz, p_names text[], p_lock integer, p_schema text
    ) RETURNS TABLE (
        out_run text, out_message bigint, out_task bigint, out_task_run text, out_workflow text,
        out_queue text, out_priority integer, out_owner text, out_until timestamptz, out_version integer
    )
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
    BEGIN
        RETURN QUERY
        WITH r AS (
            INSERT INTO {s}.runs AS n (run_id, workflow_name, queue, status, instance_id, priority,
                concurrency_key, labels, parent_run_id, created_at, last_seq)
            VALUES (p_run, p_name, p_queue, 'CREATED', p_instance, p_priority, p_key, p_labels,
                p_parent, p_now, 1)
            -- the arbiter is the partial unique index runs_live_instance: a live run with this
            -- instance id wins, and an insert racing with this one waits for it
            ON CONFLICT (instance_id) WHERE instance_id IS NOT NULL AND status IN """
        + LIVE
        + """
            DO NOTHING
            RETURNING n.run_id, n.queue, n.workflow_name, n.priority, n.concurrency_key
        ),
        """
        + history_insert
        + """
        i AS (
            INSERT INTO {s}.inbox AS m (run_id, kind, message, visible_from)
            SELECT r.run_id, p_kind, p_message, p_now FROM r RETURNING m.message_id
        ),
        t AS (
            INSERT INTO {s}.workflow_tasks AS w (queue, run_id, workflow_name, priority, locked_by,
                locked_until, lock_version)
            SELECT r.queue, r.run_id, r.workflow_name, r.priority, p_owner, p_until, 1
            FROM r JOIN {s}.queues qu ON qu.name = r.queue AND qu.kind = 'workflow'
            WHERE p_claim AND r.concurrency_key IS NULL AND NOT qu.paused
              AND r.workflow_name = ANY(p_names)
              AND (SELECT count(*) FROM {s}.workflow_tasks c WHERE c.queue = r.queue) < qu.capacity
              AND pg_try_advisory_xact_lock(p_lock, hashtext(p_schema))
            RETURNING w.task_id, w.run_id, w.workflow_name, w.queue, w.priority, w.locked_by,
                w.locked_until, w.lock_version
        )
        SELECT r.run_id, (SELECT i.message_id FROM i), t.task_id, t.run_id, t.workflow_name, t.queue,
            t.priority, t.locked_by, t.locked_until, t.lock_version
        FROM r LEFT JOIN t ON true;
    END
    $$
    """
    )


_V4 = [
    # A start as one function call. The adapter's sessions force custom plans (see
    # connection.session_settings), so a plain statement is planned anew on every execution;
    # the function's SET clause lets its one statement keep a generic plan per session instead
    # (measured: a start ~0.63 -> ~0.55 ms). Every value in it is a key or a literal row, and
    # the count of a queue's tasks is pruned to the queue's partition at execution.
    # Returns no row when a live run holds the instance id (ON CONFLICT .. DO NOTHING); else the
    # run id, the RunStarted message's id and, with p_claim, the run's first workflow task when
    # the scheduler would create it at once anyway (no concurrency key, the queue active with a
    # free slot, the workflow among p_names, the scheduler's lock free: tried, never waited for).
    _create_run_function("h AS (INSERT INTO {s}.history (run_id, seq, event) SELECT r.run_id, 1, p_event FROM r),"),
]


_V5 = [
    # The history as one row per write (a block of consecutive events, a dex.v1.HistoryBlock)
    # instead of one row per event: a three-activity workflow's one task wrote 16 rows and 16
    # index entries, now one (measured: a flush's history insert ~1.6 -> ~0.3 ms of server time
    # per 15 workflows, and ~35 -> ~9 us of client time per workflow). ``first_seq`` and
    # ``last_seq`` bound the block's sequence numbers, so a tail load finds its blocks by key.
    # The events stored so far become one-event blocks: a block is its events' bytes, each as
    # field 1 (tag 0x0a, then the length as a varint).
    """
    CREATE FUNCTION {s}.dex_varint(n bigint) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        encoded bytea := ''::bytea;
    BEGIN
        WHILE n >= 128 LOOP
            encoded := encoded || set_byte('\\x00'::bytea, 0, ((n & 127) | 128)::integer);
            n := n >> 7;
        END LOOP;
        RETURN encoded || set_byte('\\x00'::bytea, 0, n::integer);
    END
    $$
    """,
    "ALTER TABLE {s}.history RENAME COLUMN seq TO first_seq",
    "ALTER TABLE {s}.history RENAME COLUMN event TO events",
    "ALTER TABLE {s}.history ADD COLUMN last_seq integer",
    (
        "UPDATE {s}.history SET last_seq = first_seq,"
        " events = '\\x0a'::bytea || {s}.dex_varint(length(events)) || events"
    ),
    "ALTER TABLE {s}.history ALTER COLUMN last_seq SET NOT NULL",
    "DROP FUNCTION {s}.dex_varint(bigint)",
    _create_run_function(
        "h AS (INSERT INTO {s}.history (run_id, first_seq, last_seq, events) SELECT r.run_id, 1, 1, p_event FROM r),"
    ),
]

MIGRATIONS: Sequence[tuple[int, Sequence[str]]] = ((1, _V1), (2, _V2), (3, _V3), (4, _V4), (5, _V5))
LATEST_VERSION = MIGRATIONS[-1][0]


class DatabasePermissionError(DexError, PermissionError):
    """The database role lacks a privilege dex needs (docs/operations.md lists them)."""


def validate_schema(schema: object) -> str:
    """Return ``schema`` if it can name dex's PostgreSQL schema, else raise ValueError.

    Any name PostgreSQL takes as a quoted identifier works (quotes, semicolons, spaces, ``$$``:
    it only ever reaches SQL through ``sql.Identifier``), except one holding ``%``: psycopg
    reads ``%`` in a statement that has parameters as a placeholder, and the schema's name is
    part of every statement's text.
    """
    if not isinstance(schema, str):
        raise ValueError(f"schema must be a non-empty str of at most 63 bytes, got {schema!r}")
    try:
        size = len(schema.encode())
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 spelling, so no name in PostgreSQL
        size = -1
    if not 1 <= size <= 63 or "\x00" in schema:
        raise ValueError(f"schema must be a non-empty str of at most 63 bytes, got {schema!r}")
    if "%" in schema:
        raise ValueError(
            f"schema {schema!r} contains '%', which psycopg would read as a parameter placeholder: choose a name without it"
        )
    return schema


def dollar_quoted(statement: str, schema: str) -> str:
    """``statement`` with its ``$$`` quotes (function bodies) replaced by a tag that the
    schema's name does not contain, so a name with ``$$`` in it cannot end the body early.

    The body, the function and everything else the statement makes are the same whatever the
    tag: released migrations keep their text, and databases they made stay as they are.
    """
    if "$$" not in statement:
        return statement
    n = 0
    while (tag := f"$dex{n or ''}$") in schema:
        n += 1
    return statement.replace("$$", tag)


class Statements:
    """Composes SQL text whose ``{s}`` stands for the configured schema (cached per text).

    The schema goes in as an ``sql.Identifier``; the composed statement is rendered to bytes
    once and cached, so psycopg does not compose and quote it again on every execute.
    """

    def __init__(self, schema: str) -> None:
        self.schema = validate_schema(schema)
        self._ident = sql.Identifier(self.schema)
        self._cache: dict[str, bytes] = {}

    def __call__(self, text: str) -> bytes:
        rendered = self._cache.get(text)
        if rendered is None:
            # the same text always gives the same query string, which psycopg then prepares
            rendered = self._cache[text] = sql.SQL(text).format(s=self._ident).as_bytes(None)
        return rendered

    def composed(self, text: str) -> sql.Composed:
        """The statement as an ``sql.Composed``, for building a larger one from parts."""
        return sql.SQL(text).format(s=self._ident)


def migrate(target: str | psycopg.Connection, schema: str = "dex") -> int:
    """Bring ``schema`` up to the latest version; return the version it is at.

    ``target`` is a DSN or an open connection (its transaction is committed, or a savepoint is
    used if one is already open). Idempotent; concurrent callers serialise on an advisory lock.
    """
    if isinstance(target, str):
        # through connect(): psycopg's own errors may quote the DSN, password and all
        with connect(prepare_conninfo(target, None)) as conn:
            return migrate(conn, schema)
    q = Statements(schema)
    with target.transaction():
        # held until commit: a second migrator waits here, then finds everything applied
        target.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_MIGRATE, q.schema])
        # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists;
        # a role that merely owns its schema (the least dex needs) must not be asked for more
        exists = target.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [q.schema]).fetchone()
        if exists is None:
            try:
                target.execute(q("CREATE SCHEMA {s}"))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise DatabasePermissionError(
                    f"the database role may not create schema {q.schema!r}: create it once as an administrator "
                    f"(CREATE SCHEMA {q.schema} AUTHORIZATION <role>) and run dex as its owner"
                ) from exc
        target.execute(
            q(
                "CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        row = target.execute(q("SELECT coalesce(max(version), 0) FROM {s}.schema_version")).fetchone()
        current = row[0] if row else 0
        if current > LATEST_VERSION:
            raise RuntimeError(
                f"schema {q.schema!r} is at version {current}, newer than this dex ({LATEST_VERSION}); upgrade dex"
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                target.execute(q(dollar_quoted(statement, q.schema)))
            target.execute(q("INSERT INTO {s}.schema_version (version) VALUES (%s)"), [version])
            current = version
    return current


def schema_version(conn: psycopg.Connection, schema: str) -> int:
    """The applied version of ``schema`` (0 when it has none)."""
    exists = conn.execute(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'schema_version'",
        [validate_schema(schema)],
    ).fetchone()
    if exists is None:
        return 0
    row = conn.execute(Statements(schema)("SELECT coalesce(max(version), 0) FROM {s}.schema_version")).fetchone()
    return row[0] if row else 0


def partition_name(kind: str, queue: str) -> str:
    """The partition of ``kind``'s task table that holds queue ``queue``."""
    return f"{PARTITIONED_TABLES[kind]}__{validate_queue(queue)}"


def create_partition(conn: psycopg.Connection, schema: str, kind: str, queue: str) -> None:
    """Create the task partition of a queue if it is missing.

    ``CREATE TABLE .. PARTITION OF`` takes an ACCESS EXCLUSIVE lock on the parent table, so it
    waits for in-flight claims and blocks new ones until commit; callers run it in a short
    transaction of its own, and only for a queue they just inserted into ``queues``.
    """
    parent = PARTITIONED_TABLES[kind]
    conn.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {partition} PARTITION OF {parent} FOR VALUES IN ({queue})").format(
            partition=sql.Identifier(schema, partition_name(kind, queue)),
            parent=sql.Identifier(schema, parent),
            queue=sql.Literal(queue),
        )
    )
