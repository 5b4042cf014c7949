"""The connections of ``async def`` transaction steps, kept from one step to the next.

An ``async def`` step runs on a ``psycopg.AsyncConnection`` on the engine's event loop for async
activities (:mod:`dex.app.activities.event_loop`), not on a connection of the adapter's pool. Each
attempt used to open one and close it after: a new server process per step (~1.5 ms) and the
loop's Python for the connection, the session's settings and the close; three such steps per
workflow ran at ~55 workflows/s on this machine, where three synchronous ones run at ~850
(docs/decisions/transaction-steps-in-groups.md). Now an attempt takes an idle connection if there is one
and gives it back after, as the pool does with its own:

* a new connection is a :class:`~.step_connections.StepAsyncConnection` (a
  ``psycopg.AsyncConnection`` that refuses to end the step's transaction while the step's
  function holds it);
* it gets the pool's session settings once (:func:`.sessions.settings_query`), so
  a step's transaction needs no ``SET LOCAL`` of its own, and its isolation level goes with the
  ``BEGIN`` psycopg sends;
* given back, the session is restored as the pool's are after a step (:mod:`.sessions`): what the
  function did to it is undone, and a session that cannot be restored, or whose prepared
  statements the function deallocated, is closed;
* an idle connection is closed when it waited longer than ``idle_for``, when it belongs to
  another event loop than the one asking (the engine restarted its loop), and when the server
  closed it meanwhile; at most ``keep`` wait at once (:mod:`.idle_connections` keeps that
  account, as for synchronous steps; the adapter's step slots bound how many are in use).

Everything here runs on the loop but :meth:`AsyncSessions.close`, which closes the idle
connections from any thread (libpq's own close, which needs no loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg
from psycopg import pq

from dex.adapters.postgres.connection import usable
from dex.adapters.postgres.idle_connections import IdleConnections
from dex.adapters.postgres.sessions import missing_prepared
from dex.adapters.postgres.step_connections import StepAsyncConnection, StepAsyncCursor

log = logging.getLogger(__name__)


class AsyncSessions:
    """Idle ``AsyncConnection``s of async transaction steps (see the module's docstring)."""

    def __init__(
        self,
        conninfo: str,
        settings: str,
        restore: str,
        keep: int,
        idle_for: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._conninfo, self._settings, self._restore = conninfo, settings, restore
        # an idle connection's owner is its event loop: one of another loop is not handed out
        self._idle: IdleConnections[StepAsyncConnection] = IdleConnections(keep, idle_for, clock)

    async def take(self, isolation: psycopg.IsolationLevel) -> StepAsyncConnection:
        """A connection for one step at ``isolation`` (autocommit off, no transaction open)."""
        found, dropped = self._idle.take(asyncio.get_running_loop())
        for conn in dropped:
            _finish(conn)
        if found is not None and not usable(found):
            _finish(found)  # the server closed it meanwhile, or sent something
            found = None
        conn = found if found is not None else await self._connect()
        try:
            await conn.set_isolation_level(isolation)
        except BaseException:
            _finish(conn)
            raise
        return conn

    async def _connect(self) -> StepAsyncConnection:
        conn = await StepAsyncConnection.connect(self._conninfo, autocommit=True, cursor_factory=StepAsyncCursor)
        try:
            await conn.execute(self._settings, prepare=False)
            await conn.set_autocommit(False)
        except BaseException:
            _finish(conn)
            raise
        return conn

    async def give_back(self, conn: StepAsyncConnection) -> None:
        """Restore ``conn``'s session and keep it for the next step, or close it. Raises only a
        ``BaseException`` that is not an ``Exception`` (the step's outcome stands either way)."""
        if conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            _finish(conn)
            return
        try:
            await conn.set_autocommit(True)
            cursor = await conn.execute(self._restore, prepare=False)
            while cursor.nextset():  # the last result: the session's prepared statements
                pass
            missing = missing_prepared(conn, await cursor.fetchone())
            await conn.set_autocommit(False)
        except Exception as exc:  # noqa: BLE001 - not restored: not used again
            log.info("an async transaction step's session could not be restored (%s); it is closed", type(exc).__name__)
            _finish(conn)
            return
        except BaseException:
            _finish(conn)
            raise
        if missing:
            log.info("an async transaction step deallocated prepared statements of its session; it is closed")
            _finish(conn)
            return
        if not self._idle.keep(conn, asyncio.get_running_loop()):
            _finish(conn)

    def close(self) -> None:
        """Close the idle connections; those given back later are closed then (idempotent)."""
        for conn in self._idle.close():
            _finish(conn)


def _finish(conn: psycopg.AsyncConnection) -> None:
    """Close ``conn`` with libpq's own call (no event loop needed; nothing waits on it here)."""
    try:
        conn.pgconn.finish()
    except Exception:  # already gone
        log.debug("closing an async step's connection failed", exc_info=True)
