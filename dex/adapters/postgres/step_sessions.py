"""The connections of synchronous transaction steps, kept from one step to the next.

A ``@dex.transaction`` step's attempt (or a group of first attempts, :mod:`.checkpoints`) runs
on a connection of its own, not on one of the adapter's pool. The pool serves the engine's
threads and the application's calls; an attempt whose code never returns (a ``time.sleep``, a
loop) keeps its connection for as long as its thread lives, so on the pool every such attempt
took one connection from them for good, and the pool's size bounded the steps too. Here an
attempt takes an idle connection if there is one, or opens one, and gives it back after, as
:mod:`.async_sessions` does for ``async def`` steps:

* a new connection is a :class:`~.step_connections.StepConnection` (a ``psycopg.Connection``
  that refuses to end the step's transaction while the step's function holds it);
* it gets the pool's session settings once (:func:`.sessions.settings_query`) and
  the packed arrays' dumpers (:mod:`.arrays`), as the pool's ``configure`` gives its own;
* given back, the session is restored (:func:`.sessions.session_restore`): what the function
  did to it is undone, and a session that cannot be restored, or whose prepared statements the
  function deallocated, is closed;
* an idle connection is closed when it waited longer than ``idle_for`` or when the server closed
  it meanwhile; at most ``keep`` wait at once (:mod:`.idle_connections` keeps that account, as
  for async steps; the adapter's step slots, :mod:`.step_slots`, bound how many are in use; an
  attempt whose slot was lost still holds its connection, whose session its watch ended, until
  it returns).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.connection import connect_as, usable
from dex.adapters.postgres.idle_connections import IdleConnections
from dex.adapters.postgres.step_connections import StepConnection, StepCursor

log = logging.getLogger(__name__)


class StepSessions:
    """Idle connections of synchronous transaction steps (see the module's docstring)."""

    def __init__(
        self,
        conninfo: str,
        settings: str,
        restore: Callable[[psycopg.Connection], None],
        keep: int,
        idle_for: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._conninfo, self._settings, self._restore = conninfo, settings, restore
        self._idle: IdleConnections[StepConnection] = IdleConnections(keep, idle_for, clock)

    def take(self) -> StepConnection:
        """A connection in autocommit with no transaction open (``DatabaseConnectionError`` when
        none can be opened)."""
        found, stale = self._idle.take()
        for conn in stale:
            _close(conn)
        if found is not None and usable(found):
            return found
        if found is not None:
            _close(found)  # the server closed it meanwhile, or sent something
        return self._connect()

    def _connect(self) -> StepConnection:
        conn = connect_as(self._conninfo, StepConnection, cursor_factory=StepCursor)
        try:
            conn.autocommit = True
            arrays.register(conn)
            conn.execute(self._settings, prepare=False)
        except BaseException:
            _close(conn)
            raise
        return conn

    def give_back(self, conn: StepConnection) -> None:
        """Restore ``conn``'s session and keep it for the next step, or close it. Raises only a
        ``BaseException`` that is not an ``Exception`` (the step's outcome stands either way)."""
        if not usable(conn):
            _close(conn)
            return
        self._restore(conn)  # closes a session it cannot restore
        if conn.closed:
            return
        if not self._idle.keep(conn):
            _close(conn)

    def close(self) -> None:
        """Close the idle connections; those given back later are closed then (idempotent)."""
        for conn in self._idle.close():
            _close(conn)


def _close(conn: psycopg.Connection) -> None:
    try:
        conn.close()
    except Exception:  # already gone
        log.debug("closing a transaction step's connection failed", exc_info=True)
