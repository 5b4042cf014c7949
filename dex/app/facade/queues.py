"""``Engine``'s queue administration (docs/reference/contract.md §6): :class:`Queues`, the service behind
``create_queue``, ``pause_queue``, ``resume_queue``, ``set_queue_capacity``,
``set_queue_key_concurrency``, ``set_queue_rate_limit`` and ``list_queues``.

Each change drops the engine's cached view of the queues (inline activities read it), and a
change that can free slots tells the engine's runtime (``queues_changed``), which may claim
again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from dex.app.ports.store import QueueInfo, Store, queue_capacity, queue_kind
from dex.app.workflows.inline import QueueView
from dex.domain import queue_limits as limits


class Queues:
    """Creates, pauses, resumes and sizes the queues of ``store``."""

    def __init__(self, store: Store, queue_view: QueueView, *, queues_changed: Callable[[], None]) -> None:
        self._store = store
        self._queue_view = queue_view
        self._queues_changed = queues_changed

    def create_queue(
        self,
        name: str,
        kind: str,
        capacity: int = 100,
        key_concurrency: int = 1,
        rate_limit: tuple[int, timedelta] | None = None,
    ) -> None:
        self._store.create_queue(
            name,
            queue_kind(kind),
            queue_capacity(capacity),
            limits.key_concurrency(key_concurrency),
            limits.rate_limit(rate_limit),
        )
        self._queue_view.invalidate()

    def pause_queue(self, name: str, kind: str) -> None:
        self._store.set_queue_paused(name, queue_kind(kind), True)
        self._queue_view.invalidate()

    def resume_queue(self, name: str, kind: str) -> None:
        self._store.set_queue_paused(name, queue_kind(kind), False)
        self._queue_view.invalidate()
        self._queues_changed()

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        self._store.set_queue_capacity(name, queue_kind(kind), queue_capacity(capacity))
        self._queue_view.invalidate()
        self._queues_changed()

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        self._store.set_queue_key_concurrency(name, queue_kind(kind), limits.key_concurrency(key_concurrency))
        self._queues_changed()

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: tuple[int, timedelta] | None) -> None:
        self._store.set_queue_rate_limit(name, queue_kind(kind), limits.rate_limit(rate_limit))
        self._queue_view.invalidate()  # inline attempts stop (or start again) on this queue
        self._queues_changed()

    def list_queues(self) -> list[QueueInfo]:
        return self._store.list_queues()
