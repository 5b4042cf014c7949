"""The run store's ``history_bounds``: the first and last sequence numbers of a run's history,
read without its events, so a page of a long history is found by arithmetic (the run page)."""

from __future__ import annotations

import pytest

from dex.app.ports.store import Store
from dex.domain.errors import RunNotFoundError
from dex.testing import VirtualClock
from tests.contract.ports.support import ACT, MemoryBackend, PortContract, PostgresBackend, event, start, step


class HistoryBoundsContract(PortContract):
    def test_the_first_and_last_event_of_the_history(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        assert store.history_bounds("r1") == (1, 1)
        for i in range(3):  # blocks of several events
            store.send_message("r1", event(f"e{i}"), clock.now())
            step(store, clock, "r1", activities=[ACT] * i)
            whole = store.load_history("r1")
            assert store.history_bounds("r1") == (whole[0].sequence_number, whole[-1].sequence_number)
        assert store.history_bounds("r1")[1] > 6
        with pytest.raises(RunNotFoundError):
            store.history_bounds("nope")


class TestHistoryBoundsMemory(MemoryBackend, HistoryBoundsContract):
    pass


class TestHistoryBoundsPostgres(PostgresBackend, HistoryBoundsContract):
    pass
