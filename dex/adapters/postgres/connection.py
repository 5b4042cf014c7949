"""Connecting to PostgreSQL: DSN handling, one clear error, and the connection pool.

A wrong DSN or an unreachable server must fail at once with a message naming the server
(never the password), not as a pool retrying in the background until a timeout. So the
adapter first opens one plain connection with a ``connect_timeout``; only when that works
does it open the pool.
"""

from __future__ import annotations

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from dex.domain.errors import DexError

DEFAULT_CONNECT_TIMEOUT = 5  # seconds; libpq's own default is to wait forever


class DatabaseConnectionError(DexError, ConnectionError):
    """PostgreSQL cannot be reached with the given DSN (bad DSN, server down, auth failure)."""


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN (for error messages), never its password."""
    try:
        params = pg_conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    dbname = params.get("dbname")
    return f"{where}/{dbname}" if dbname else where


def prepare_conninfo(dsn: str, connect_timeout: float | None) -> str:
    """The DSN with a ``connect_timeout`` (unless it sets one) and an application name."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise DatabaseConnectionError("no PostgreSQL DSN given (e.g. postgresql://user:password@host:5432/dbname)")
    try:
        params = pg_conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # psycopg's message quotes the DSN, which may hold a password: leave it out
        raise DatabaseConnectionError(
            "invalid PostgreSQL DSN: expected postgresql://user:password@host:port/dbname or key=value pairs"
        ) from None
    extra: dict[str, str] = {}
    if "connect_timeout" not in params:
        timeout = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        extra["connect_timeout"] = str(max(1, round(timeout)))  # libpq takes whole seconds
    if "application_name" not in params:
        extra["application_name"] = "dex"
    return pg_conninfo.make_conninfo(dsn, **extra)


def connect(conninfo: str) -> psycopg.Connection:
    """One connection, or :class:`DatabaseConnectionError` naming the server."""
    try:
        return psycopg.connect(conninfo)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseConnectionError(f"cannot connect to PostgreSQL at {describe_dsn(conninfo)}: {reason}") from None


def configure(conn: psycopg.Connection) -> None:
    """Session settings of every pooled connection.

    Timestamps are computed from the caller's clock and stored as timestamptz; reading them in
    UTC, and adding intervals (lease timeouts) in UTC, keeps them exact and free of DST jumps.
    """
    conn.execute("SET TIME ZONE 'UTC'")
    conn.commit()


def open_pool(conninfo: str, *, min_size: int, max_size: int, timeout: float, name: str) -> ConnectionPool:
    """A pool of non-autocommit connections; each ``pool.connection()`` block is one transaction."""
    pool = ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": False},
        configure=configure,
        open=False,
        name=name,
        timeout=30.0,  # how long a caller waits for a free connection
        reconnect_timeout=60.0,
    )
    try:
        pool.open(wait=True, timeout=timeout)
    except PoolTimeout as exc:
        pool.close()
        raise DatabaseConnectionError(
            f"cannot open a connection pool to PostgreSQL at {describe_dsn(conninfo)}: {exc}"
        ) from None
    return pool
