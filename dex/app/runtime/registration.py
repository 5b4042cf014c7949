"""An engine's row in the engine registry (docs/reference/contract.md §15, :mod:`dex.app.ports.engines`).

The row is written when the engine starts (:meth:`EngineRegistration.register`), then again
with the leader-election heartbeat (:meth:`EngineRegistration.beat`, called by
:class:`dex.app.runtime.leader.LeaderElection` each scheduler round), at most once per
``period``: one cheap statement per period, never one per task. Each write moves the row's
expiry to ``EXPIRY_PERIODS`` periods ahead, so a crashed engine drops out of the list after
them, while one failed or late heartbeat does not. A failed write is logged and retried at
the next period: the store being down never stops the engine. ``remove`` (a graceful stop)
deletes the row.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta

from dex.app.ports.engines import EngineInfo
from dex.app.ports.store import Store

log = logging.getLogger("dex.scheduler")

EXPIRY_PERIODS = 3  # heartbeats a live engine may miss before it is no longer listed


class EngineRegistration:
    """Keeps this engine's row: written at start, refreshed each ``period``, removed at stop."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        code_version: str | None,
        workflows: tuple[str, ...],
        activities: tuple[str, ...],
        queues: tuple[str, ...],
        period: timedelta,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        self._store, self._period = store, period
        self._node_id, self._code_version = node_id, code_version
        self._host = host if host is not None else socket.gethostname()
        self._pid = pid if pid is not None else os.getpid()
        self._names = tuple(tuple(sorted(set(names))) for names in (workflows, activities, queues))
        self._started_at: datetime | None = None  # None: not started (or stopped), no row kept
        self._beaten_at: datetime | None = None
        # a heartbeat of a scheduler thread that outlived stop() must not write the row again
        # after remove() deleted it: the write and the delete take turns
        self._lock = threading.Lock()

    def register(self) -> None:
        """The engine starts: write its row now (a failure is retried with the heartbeat)."""
        with self._lock:
            self._started_at = self._store.clock.now()
            self._beaten_at = None
            self._beat(self._started_at)

    def beat(self, now: datetime) -> None:
        """Refresh the row if a period has passed since the last write (or its attempt)."""
        with self._lock:
            self._beat(now)

    def _beat(self, now: datetime) -> None:
        started_at = self._started_at
        if started_at is None or (self._beaten_at is not None and now - self._beaten_at < self._period):
            return
        self._beaten_at = now
        workflows, activities, queues = self._names
        info = EngineInfo(
            node_id=self._node_id,
            host=self._host,
            pid=self._pid,
            code_version=self._code_version,
            workflows=workflows,
            activities=activities,
            queues=queues,
            started_at=started_at,
            last_seen=now,
        )
        try:
            self._store.heartbeat_engine(info, now, now + self._period * EXPIRY_PERIODS)
        except Exception:
            log.warning("the engine registry heartbeat failed; retried in %s", self._period, exc_info=True)

    def remove(self) -> None:
        """The engine stops: delete its row (if that fails, it expires)."""
        with self._lock:
            if self._started_at is None:
                return
            self._started_at = None
            try:
                self._store.remove_engine(self._node_id)
            except Exception:
                log.warning("could not remove the engine's registry row; it expires on its own", exc_info=True)
