"""The benchmark's PostgreSQL: ``DEX_DATABASE_URL`` if set, else an embedded server (pgserver).

Also: fresh schema names, the server's transaction counter, and cloning a template run many
times over in SQL (how the scale curves get 100k waiting or finished runs in seconds).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

ENV_VAR = "DEX_DATABASE_URL"


def server_dsn() -> tuple[str, str]:
    """``(dsn, description)``: the database named by DEX_DATABASE_URL, or a new embedded server."""
    dsn = os.environ.get(ENV_VAR)
    if dsn:
        return dsn, f"{ENV_VAR} ({describe(dsn)})"
    return _embedded_dsn(), "embedded pgserver (a temporary directory, deleted at exit)"


def _embedded_dsn() -> str:
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root)
        warnings.simplefilter("ignore")
        import pgserver

    # run as root, pgserver runs the server as the system user "pgserver", which must be able to
    # enter the directory holding the data directory and the socket
    base = Path(tempfile.mkdtemp(prefix="dex-bench-pg-", dir="/tmp"))
    base.chmod(0o777)
    atexit.register(shutil.rmtree, base, ignore_errors=True)  # runs after pgserver's own cleanup
    server = pgserver.get_server(base / "data", cleanup_mode="delete")
    return str(server.get_uri())


def describe(dsn: str) -> str:
    """host/dbname of a DSN, without credentials."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<DSN>"
    return f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}"


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def new_schema(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def transactions(dsn: str, settle: float = 1.0) -> int:
    """``xact_commit + xact_rollback`` of the current database, as the statistics say.

    Backends flush their statistics at exit and otherwise only every second or so when idle:
    callers close their connections first, and ``settle`` gives the exiting backends time.
    """
    if settle:
        time.sleep(settle)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")  # PG15+: this backend's own counters
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _tables_with_run_id(conn: psycopg.Connection, schema: str) -> list[str]:
    """Tables (partitioned parents, not their partitions) of ``schema`` that have a run_id."""
    rows = conn.execute(
        """
        SELECT c.relname FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'run_id' AND NOT a.attisdropped
        WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
        ORDER BY c.relname
        """,
        [schema],
    ).fetchall()
    return [row[0] for row in rows]


def _copyable_columns(conn: psycopg.Connection, schema: str, table: str) -> list[str]:
    """Columns that an INSERT should set: no identity, generated or serial (nextval) columns."""
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attidentity = '' AND a.attgenerated = ''
          AND coalesce(pg_get_expr(d.adbin, d.adrelid), '') NOT LIKE 'nextval(%%'
        ORDER BY a.attnum
        """,
        [schema, table],
    ).fetchall()
    return [row[0] for row in rows]


def clone_run(dsn: str, schema: str, template_run_id: str, count: int, batch: int = 20_000) -> None:
    """Insert ``count`` copies of a run (every row of every table keyed by run_id), new run ids.

    The copies are what the engine would have written for ``count`` runs of the same workflow
    with the same input, so they stand for runs that reached the template's state (waiting on
    a timer, or finished). The ``runs`` table is copied first (the others reference it).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = _tables_with_run_id(conn, schema)
        tables.sort(key=lambda t: (t != "runs", t))
        columns = {table: _copyable_columns(conn, schema, table) for table in tables}
        done = 0
        while done < count:
            n = min(batch, count - done)
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS bench_clone_ids (run_id text) ON COMMIT DELETE ROWS")
                conn.execute(
                    "INSERT INTO bench_clone_ids SELECT gen_random_uuid()::text FROM generate_series(1, %s)", [n]
                )
                for table in tables:
                    cols = columns[table]
                    select = [
                        sql.SQL("c.run_id") if col == "run_id" else sql.SQL("t.{}").format(sql.Identifier(col))
                        for col in cols
                    ]
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {table} ({cols}) SELECT {select} FROM bench_clone_ids c"
                            " CROSS JOIN {table} t WHERE t.run_id = %s"
                        ).format(
                            table=sql.Identifier(schema, table),
                            cols=sql.SQL(", ").join(sql.Identifier(col) for col in cols),
                            select=sql.SQL(", ").join(select),
                        ),
                        [template_run_id],
                    )
            done += n
        for table in tables:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, table)))


def table_sizes(dsn: str, schema: str) -> dict[str, int]:
    """Row counts of the schema's run-keyed tables (for the report)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            table: int(
                conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))).fetchone()[0]  # type: ignore[index]
            )
            for table in _tables_with_run_id(conn, schema)
        }
