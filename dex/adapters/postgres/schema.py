"""The PostgreSQL schema: the migration runner, per-queue partitions and statement composition.

Everything lives in one schema (``dex`` unless configured), so several deployments or test
cases can share a database. The migrations themselves are frozen texts, one module per
version in :mod:`dex.adapters.postgres.migrations`; ``schema_version`` records the applied
ones, and :func:`migrate` applies the missing ones under a transaction-scoped advisory lock,
so that engines starting together serialise instead of racing on ``CREATE TABLE``.

Identifiers (the schema, partition names) only ever reach SQL through
:class:`psycopg.sql.Identifier`, values through parameters or :class:`psycopg.sql.Literal`.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from dex.adapters.postgres.connection import connect, prepare_conninfo
from dex.adapters.postgres.migrations import LATEST_VERSION, MIGRATIONS
from dex.domain.definitions import validate_queue
from dex.domain.errors import DexError

# Status lists are spelled out literally (not passed as parameters) wherever a partial index
# must match: the planner can only use a partial index whose predicate the query implies.
# Migrations 1 and 13 spelled out their own copies (runs_live_instance, runs_finished): these must
# stay equal to them, but the migrations never read these.
LIVE = "('CREATED', 'RUNNING', 'SUSPENDED')"
TERMINAL = "('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED')"

# advisory lock classes (first key of pg_advisory_xact_lock(int, int)); the second key is the
# hash of the schema name, so two schemas in one database do not wait for each other
LOCK_MIGRATE = 0x0DE1
LOCK_SCHEDULE_WORKFLOWS = 0x0DE2
LOCK_SCHEDULE_ACTIVITIES = 0x0DE3
LOCK_INSTANCE = 0x0DE4  # with a hash of the schema and an instance id (instances.py)

PARTITIONED_TABLES = {"workflow": "workflow_tasks", "activity": "activity_tasks"}


class DatabasePermissionError(DexError, PermissionError):
    """The database role lacks a privilege dex needs (docs/how-to/operate.md lists them)."""


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


def migrate(target: str | psycopg.Connection, schema: str = "dex", *, version: int | None = None) -> int:
    """Bring ``schema`` up to the latest version (or only up to ``version``); return the version it is at.

    ``target`` is a DSN or an open connection (its transaction is committed, or a savepoint is
    used if one is already open). Idempotent; concurrent callers serialise on an advisory lock.
    ``version`` stops the upgrade early (tests build a database as an older dex left it); a
    schema already past it stays as it is.
    """
    if version is not None and not 0 <= version <= LATEST_VERSION:
        raise ValueError(f"version must be between 0 and {LATEST_VERSION}, got {version!r}")
    if isinstance(target, str):
        # through connect(): psycopg's own errors may quote the DSN, password and all
        with connect(prepare_conninfo(target, None)) as conn:
            return migrate(conn, schema, version=version)
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
        for number, statements in MIGRATIONS:
            if number <= current or (version is not None and number > version):
                continue
            # the runner's only part in a migration's text: the schema's name, quoted
            for statement in statements:
                target.execute(q(dollar_quoted(statement, q.schema)))
            target.execute(q("INSERT INTO {s}.schema_version (version) VALUES (%s)"), [number])
            current = number
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
