"""``Engine``'s queue administration (SPEC §6): create, pause, resume and size queues.

A mixin of its own so that the engine facade stays one screenful of run calls; each change
drops the engine's cached view of the queues (inline activities read it), and a change that
can free slots tells the coordinator, which may claim again at once.
"""

from __future__ import annotations

from dex.app.background import Background
from dex.app.inline import QueueView
from dex.app.ports import QueueInfo, Store, queue_capacity, queue_kind


class QueueEngineMixin:
    """``Engine``'s queue methods."""

    store: Store
    _queue_view: QueueView
    _background: Background

    def create_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        self.store.create_queue(name, queue_kind(kind), queue_capacity(capacity))
        self._queue_view.invalidate()

    def pause_queue(self, name: str, kind: str) -> None:
        self.store.set_queue_paused(name, queue_kind(kind), True)
        self._queue_view.invalidate()

    def resume_queue(self, name: str, kind: str) -> None:
        self.store.set_queue_paused(name, queue_kind(kind), False)
        self._queue_view.invalidate()
        self._background.queues_changed()

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        self.store.set_queue_capacity(name, queue_kind(kind), queue_capacity(capacity))
        self._queue_view.invalidate()
        self._background.queues_changed()

    def list_queues(self) -> list[QueueInfo]:
        return self.store.list_queues()
