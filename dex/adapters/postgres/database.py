"""The PostgreSQL adapter's way to its database: pooled connections as statements or transactions.

Every part of :class:`~dex.adapters.postgres.PostgresAdapter` (runs, task queues, queues,
schedules, forks) receives one :class:`Database` and runs each port call as one of:

- a **statement** (:meth:`Database.statement`): the pool's connections are in autocommit, so a
  call that is one statement sends no ``BEGIN``/``COMMIT`` around it (a single statement is
  atomic on its own). With ``kept``, the connection kept for the application's starts
  (:class:`~dex.adapters.postgres.connection.KeptConnection`).
- a **transaction** (:meth:`Database.transaction`): a ``conn.transaction()`` block, or, with
  ``pipeline``, psycopg's pipeline mode (:func:`~dex.adapters.postgres.dispatch.begin`).
- a **connection** (:meth:`Database.connection`) on which the caller begins its own
  transaction and reads after it (the completions that claim what they made due).

A pool that has no connection to give within its ``wait_timeout`` becomes a
:class:`~dex.adapters.postgres.connection.DatabaseConnectionError` naming the server (never
the password). The adapter owns the pool and the kept connection and closes them; this object
only hands their connections out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from dex.adapters.postgres import dispatch
from dex.adapters.postgres.connection import DatabaseConnectionError, KeptConnection


class Database:
    """Connections of one adapter's pool, for its parts' statements and transactions."""

    def __init__(self, pool: ConnectionPool, kept: KeptConnection, where: str) -> None:
        self._pool = pool
        self._kept = kept
        self._where = where  # host:port/dbname, for the error when no connection comes free

    @contextmanager
    def statement(self, kept: bool = False) -> Iterator[psycopg.Connection]:
        """A connection in autocommit for an operation that is one statement; with ``kept``,
        the connection kept for starts."""
        try:
            with self._kept.connection() if kept else self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise DatabaseConnectionError(f"no connection to PostgreSQL at {self._where}: {exc}") from None

    @contextmanager
    def transaction(self, pipeline: bool = False) -> Iterator[psycopg.Connection]:
        """A transaction; with ``pipeline``, statements whose results are not read are sent
        without waiting for each answer (psycopg's pipeline mode: fewer network round trips)."""
        with self.connection() as conn, dispatch.begin(conn, pipeline):
            yield conn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, for a transaction the caller begins and what it reads after it."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            # no connection came free, or none could be made: the server is down or overloaded
            raise DatabaseConnectionError(f"no connection to PostgreSQL at {self._where}: {exc}") from None
