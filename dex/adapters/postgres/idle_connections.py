"""Which idle connections of transaction steps are kept, which one a step is handed, and which
are closed: the bookkeeping that :mod:`.step_sessions` and :mod:`.async_sessions` share.

It does no I/O: it never connects, checks or closes a connection. Each call says which
connections the caller is to close (a synchronous one with ``close()``, an async one with
libpq's own ``finish()``), so both kinds keep the same rules:

* a step is handed the connection given back last (its server process is the warmest) among
  those that waited less than ``idle_for``;
* a connection that waited ``idle_for`` or longer is closed when the next step asks, and so is
  one that belongs to another *owner* than the one asking (an async connection's event loop:
  the engine restarted its loop; synchronous ones have no owner);
* at most ``keep`` wait at once, and none once :meth:`IdleConnections.close` was called.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import attrs

C = TypeVar("C")


@attrs.frozen
class _Idle(Generic[C]):
    conn: C
    owner: object
    since: float


class IdleConnections(Generic[C]):
    """At most ``keep`` idle connections, each kept at most ``idle_for`` seconds of ``clock``
    (see the module's docstring); safe to use from several threads."""

    def __init__(self, keep: int, idle_for: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep, self._idle_for, self._clock = keep, idle_for, clock
        self._idle: list[_Idle[C]] = []  # in the order they were given back
        self._closed = False
        self._lock = threading.Lock()

    def take(self, owner: object = None) -> tuple[C | None, list[C]]:
        """The connection of ``owner`` given back last that waited less than ``idle_for`` (``None``
        when there is none), and those the caller is to close now: the ones that waited longer and
        those of another owner."""
        now = self._clock()
        found: C | None = None
        kept: list[_Idle[C]] = []
        dropped: list[C] = []
        with self._lock:
            for idle in reversed(self._idle):  # the most recently given back first
                fresh = idle.owner is owner and now - idle.since < self._idle_for
                if fresh and found is None:
                    found = idle.conn
                elif fresh:
                    kept.append(idle)
                else:
                    dropped.append(idle.conn)
            self._idle = kept[::-1]
        return found, dropped

    def keep(self, conn: C, owner: object = None) -> bool:
        """Keep ``conn`` (of ``owner``) for a next step; ``False`` when it is not kept (``keep``
        wait already, or :meth:`close` was called): the caller closes it."""
        idle = _Idle(conn, owner, self._clock())
        with self._lock:
            if self._closed or len(self._idle) >= self._keep:
                return False
            self._idle.append(idle)
            return True

    def close(self) -> list[C]:
        """Keep none from now on; the connections that waited, for the caller to close
        (idempotent: a second call returns none)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        return [entry.conn for entry in idle]
