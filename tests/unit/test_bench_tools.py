"""The benchmark tools that decompose a start and time the engine's Python path still measure
what they say: the schedstat arithmetic, a decide path that really completes the run, and the
I/O tool's queues read as full."""

from __future__ import annotations

import pytest

from benchmarks.decide_path import DecidePath
from benchmarks.io_bound import read_queues_as_full
from benchmarks.start_loop import SchedStat, parse_schedstat, per_start
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivitySlots


def test_schedstat_is_three_numbers() -> None:
    assert parse_schedstat("1500000 250000 12\n") == SchedStat(1_500_000, 250_000, 12)
    with pytest.raises(ValueError, match="three numbers"):
        parse_schedstat("1500000 250000")


def test_a_start_is_split_into_cpu_run_queue_and_blocked_time() -> None:
    before = SchedStat(on_cpu_ns=1_000_000, run_queue_ns=0, slices=10)
    after = SchedStat(on_cpu_ns=1_000_000 + 200_000_000, run_queue_ns=50_000_000, slices=1010)
    figures = per_start(wall=0.6, before=before, after=after, n=1000)
    assert figures["wall"] == pytest.approx(0.6)
    assert figures["on_cpu"] == pytest.approx(0.2)
    assert figures["run_queue"] == pytest.approx(0.05)
    assert figures["blocked"] == pytest.approx(0.35)
    assert figures["slices"] == pytest.approx(1.0)


def test_the_decide_path_completes_each_run_inline() -> None:
    path = DecidePath()
    path.check()  # raises unless the run ends COMPLETED with its sixteen events
    assert path.run(20) > 0
    assert path.engine.list_runs() == []  # nothing went through a store: the path alone


def test_queues_read_full_makes_the_engine_see_every_slot_held_and_changes_nothing_stored() -> None:
    adapter = InMemoryAdapter()
    adapter.ensure_queue("default", "activity", 7)
    read_queues_as_full(adapter)
    assert adapter.activity_slots() == [ActivitySlots(queue="default", paused=False, capacity=7, held=7)]
    assert [q.depth for q in adapter.list_queues()] == [0]  # what is stored is as it was
