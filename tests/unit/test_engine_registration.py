"""``EngineRegistration``: when the engine's registry row is written and deleted, over a store
that records the calls (the store's side is tests/contract/test_engine_registry.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from dex.adapters.memory import InMemoryAdapter
from dex.app.runtime.registration import EXPIRY_PERIODS, EngineRegistration
from dex.testing import VirtualClock

PERIOD = timedelta(seconds=5)


class Recording(InMemoryAdapter):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock)
        self.calls: list[tuple[Any, ...]] = []

    def heartbeat_engine(self, info: Any, now: datetime, expires_at: datetime) -> None:
        self.calls.append(("heartbeat", now, expires_at))
        super().heartbeat_engine(info, now, expires_at)

    def remove_engine(self, node_id: str) -> None:
        self.calls.append(("remove", node_id))
        super().remove_engine(node_id)


def registration(store: Recording) -> EngineRegistration:
    return EngineRegistration(
        store,
        node_id="n-1",
        code_version=None,
        workflows=("b", "a", "a"),
        activities=(),
        queues=("q", "default", "q"),
        period=PERIOD,
        host="h",
        pid=12,
    )


def test_written_at_start_then_once_a_period_then_deleted_at_stop_and_never_again() -> None:
    clock = VirtualClock()
    store = Recording(clock)
    keeper = registration(store)
    keeper.beat(clock.now())
    assert store.calls == []  # not started: no row
    keeper.register()
    start = clock.now()
    assert store.calls == [("heartbeat", start, start + PERIOD * EXPIRY_PERIODS)]
    for _ in range(10):
        keeper.beat(clock.now())
    clock.advance(PERIOD - timedelta(milliseconds=1))
    keeper.beat(clock.now())
    assert len(store.calls) == 1  # within the period: nothing more
    clock.advance(timedelta(milliseconds=1))
    keeper.beat(clock.now())
    assert store.calls[-1] == ("heartbeat", clock.now(), clock.now() + PERIOD * EXPIRY_PERIODS)
    (info,) = store.list_engines(clock.now())
    assert (info.workflows, info.queues, info.started_at) == (("a", "b"), ("default", "q"), start)
    keeper.remove()
    assert store.calls[-1] == ("remove", "n-1") and store.list_engines(clock.now()) == []
    clock.advance(PERIOD * 2)
    keeper.beat(clock.now())  # a round of a thread that outlived stop(): writes nothing
    keeper.remove()
    assert store.calls[-1] == ("remove", "n-1") and len(store.calls) == 3
