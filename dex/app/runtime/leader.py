"""Leader-only components: leader election, the two task schedulers, and maintenance.

Only the node holding the leadership lease schedules, so the scheduling decisions (queue
capacity, concurrency keys) are taken by one node at a time; every node runs workers.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from dex.app.ports.store import Store
from dex.app.ports.telemetry import Telemetry, TelemetryHub
from dex.app.runtime.registration import EngineRegistration

log = logging.getLogger("dex.scheduler")


class LeaderElection:
    """Takes or renews the leadership lease; a node that cannot renew assumes it lost it."""

    def __init__(
        self,
        store: Store,
        node_id: str,
        *,
        ttl: timedelta = timedelta(seconds=15),
        telemetry: Telemetry | None = None,
        registration: EngineRegistration | None = None,
    ) -> None:
        self._store, self._node_id, self._ttl = store, node_id, ttl
        self._registration = registration  # the engine's registry row, refreshed with this heartbeat
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self.is_leader = False
        self._renewed_at: datetime | None = None

    def step(self) -> bool:
        now = self._store.clock.now()
        if self._registration is not None:
            self._registration.beat(now)  # writes at most once per its period
        # renew at a third of the lease, so that a slow round does not let it lapse
        if self.is_leader and self._renewed_at is not None and now - self._renewed_at < self._ttl / 3:
            return True
        try:
            leading = self._store.try_lead(self._node_id, now, self._ttl)
        except Exception:
            log.warning("leadership renewal failed; acting as a follower", exc_info=True)
            leading = False
        if leading != self.is_leader:
            log.info("node %s %s leadership", self._node_id, "took" if leading else "lost")
        self.is_leader = leading
        self._telemetry.leadership(leading)
        self._renewed_at = now if leading else None
        return leading

    def release(self) -> None:
        if self.is_leader:
            self._store.release_leadership(self._node_id)
        self.is_leader = False
        self._telemetry.leadership(False)
        self._renewed_at = None


class WorkflowTaskScheduler:
    """Creates workflow tasks for runs whose inbox has visible messages."""

    def __init__(self, store: Store, *, batch_size: int = 256) -> None:
        self._store, self.batch_size = store, batch_size

    def step(self) -> int:
        return self._store.schedule_workflow_tasks(self._store.clock.now(), self.batch_size)


class ActivityTaskScheduler:
    """Makes activity tasks whose time has come (first attempts and retries) claimable."""

    def __init__(self, store: Store, *, batch_size: int = 256) -> None:
        self._store, self._batch_size = store, batch_size

    def step(self) -> int:
        return self._store.schedule_activity_tasks(self._store.clock.now(), self._batch_size)


class RetentionMaintenance:
    """Deletes finished runs older than the retention period, a batch at a time."""

    def __init__(
        self,
        store: Store,
        *,
        retention: timedelta = timedelta(days=7),
        interval: timedelta = timedelta(minutes=1),
        batch_size: int = 500,
    ) -> None:
        self._store, self._retention, self._interval, self._batch_size = store, retention, interval, batch_size
        self._last_run: datetime | None = None

    def step(self) -> int:
        now = self._store.clock.now()
        if self._last_run is not None and now - self._last_run < self._interval:
            return 0
        self._last_run = now
        deleted = self._store.delete_finished_runs(now - self._retention, self._batch_size)
        if deleted:
            log.info("deleted %d finished runs past retention", deleted)
            self._last_run = None  # more may be left: go on next round
        return deleted
