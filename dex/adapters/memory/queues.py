"""The in-memory adapter's queue administration, leadership lease and due-time query.

Queues are rows of the shared tables (``state.py``: runs and results create the queues they
use); the leader's lease is this part's own. Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState, check_queue
from dex.adapters.memory.tables import CREATED, QUEUED, ActivityTaskRow, QueueRow, WorkflowTaskRow
from dex.app.ports.store import ACTIVITY, WORKFLOW, ActivitySlots, QueueInfo
from dex.domain import queue_limits as limits
from dex.domain.queue_limits import RateLimit


class MemoryQueues:
    """Queue administration, the leadership lease and the next due time over the shared tables."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._leader: tuple[str, datetime] | None = None  # (node id, lease until), under the state's lock

    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        self._state.ensure_queue(name, kind, capacity)

    def create_queue(
        self, name: str, kind: str, capacity: int, key_concurrency: int = 1, rate_limit: RateLimit | None = None
    ) -> None:
        check_queue(name, kind, capacity)
        n, limit = limits.key_concurrency(key_concurrency), limits.rate_limit(rate_limit)
        with self._state.lock:
            queue = self._state.queue(name, kind)
            queue.capacity, queue.key_concurrency = capacity, n
            queue.limit_rate(limit)

    def _existing_queue(self, name: str, kind: str) -> QueueRow:
        check_queue(name, kind, 1)
        queue = self._state.queues.get((name, kind))
        if queue is None:
            raise ValueError(f"there is no {kind} queue named {name!r}")
        return queue

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        with self._state.lock:
            self._existing_queue(name, kind).paused = paused

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        check_queue(name, kind, capacity)
        with self._state.lock:
            self._existing_queue(name, kind).capacity = capacity

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        n = limits.key_concurrency(key_concurrency)
        with self._state.lock:
            self._existing_queue(name, kind).key_concurrency = n

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: RateLimit | None) -> None:
        limit = limits.rate_limit(rate_limit)
        with self._state.lock:
            self._existing_queue(name, kind).limit_rate(limit)

    def list_queues(self) -> list[QueueInfo]:
        state = self._state
        with state.lock:
            infos = []
            for (name, kind), queue in sorted(state.queues.items()):
                tasks: Iterable[WorkflowTaskRow | ActivityTaskRow] = (
                    state.workflow_tasks.values() if kind == WORKFLOW else state.activity_tasks.values()
                )
                depth = sum(1 for t in tasks if t.queue == name)
                status = "PAUSED" if queue.paused else "ACTIVE"
                infos.append(
                    QueueInfo(
                        name=name,
                        kind=kind,
                        status=status,
                        capacity=queue.capacity,
                        depth=depth,
                        key_concurrency=queue.key_concurrency,
                        rate_limit=queue.rate_limit,
                    )
                )
            return infos

    def activity_slots(self) -> list[ActivitySlots]:
        state = self._state
        with state.lock:
            return [
                ActivitySlots(
                    queue=name, paused=queue.held_back, capacity=queue.capacity, held=state.queued_activity_tasks(name)
                )
                for (name, kind), queue in sorted(state.queues.items())
                if kind == ACTIVITY
            ]

    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        storable.text(node_id, "node_id")
        with self._state.lock:
            if self._leader is None or self._leader[0] == node_id or self._leader[1] <= now:
                self._leader = (node_id, now + ttl)
                return True
            return False

    def release_leadership(self, node_id: str) -> None:
        with self._state.lock:
            if self._leader is not None and self._leader[0] == node_id:
                self._leader = None

    def _slots_freed(self) -> list[datetime]:
        """When each used start slot of a rate-limited queue that has tasks frees up (the
        caller holds the state's lock)."""
        state = self._state
        busy = {(t.queue, WORKFLOW) for t in state.workflow_tasks.values()}
        busy |= {(t.queue, ACTIVITY) for t in state.activity_tasks.values() if t.state == QUEUED}
        return [
            last + queue.rate_limit.period
            for key, queue in state.queues.items()
            if queue.rate_limit is not None and key in busy
            for last in queue.starts
            if last is not None
        ]

    def next_due_time(self, now: datetime) -> datetime | None:
        state = self._state
        with state.lock:
            moments = [m.visible_from for inbox in state.inbox.values() for m in inbox]
            moments += [t.visible_from for t in state.activity_tasks.values() if t.state == CREATED]
            moments += [t.lease.until for t in state.activity_tasks.values() if t.lease.until is not None]
            moments += [t.lease.until for t in state.workflow_tasks.values() if t.lease.until is not None]
            moments += self._slots_freed()
            future = [m for m in moments if m > now]
            return min(future) if future else None
