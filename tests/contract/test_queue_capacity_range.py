"""A queue's capacity out of range (an int4 column) is refused at the engine's calls and at each
store's own, naming the range, before any write: never a ``NumericValueOutOfRange`` from
PostgreSQL. The queue keeps its capacity and a healthy run completes afterwards (the web API
and form: tests/web/test_out_of_range_numbers.py; the command line: tests/cli/test_bad_input.py)."""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.app.ports.store import MAX_QUEUE_CAPACITY


@dex.workflow(name="capacity-probe")
async def probe(ctx: dex.WorkflowContext, n: int) -> int:
    return n + 1


def capacity_of(engine: dex.Engine, name: str, kind: str = "workflow") -> int:
    return next(q.capacity for q in engine.list_queues() if (q.name, q.kind) == (name, kind))


def a_run_completes(engine: dex.Engine) -> None:
    run_id = engine.start_workflow(probe, 41)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 42


@pytest.mark.parametrize("bad", [MAX_QUEUE_CAPACITY + 1, 2**63, 10**30, 0, -1, True, 1.5, "7"], ids=repr)
def test_the_engine_and_every_store_refuse_a_capacity_out_of_range(make_engine: Any, bad: Any) -> None:
    engine = make_engine([probe])
    engine.create_queue("sized", "workflow", 5)
    for call in (
        lambda: engine.create_queue("sized", "workflow", bad),
        lambda: engine.create_queue("never-made", "activity", bad),
        lambda: engine.set_queue_capacity("sized", "workflow", bad),
        lambda: engine.store.create_queue("never-made", "activity", bad),
        lambda: engine.store.set_queue_capacity("sized", "workflow", bad),
        lambda: engine.store.ensure_queue("never-made", "workflow", bad),
    ):
        with pytest.raises(ValueError, match=f"queue capacity must be an int from 1 to {MAX_QUEUE_CAPACITY}"):
            call()
    assert capacity_of(engine, "sized") == 5
    assert "never-made" not in {q.name for q in engine.list_queues()}
    a_run_completes(engine)


def test_the_largest_capacity_is_taken_and_its_queue_runs(make_engine: Any) -> None:
    engine = make_engine([probe])
    engine.create_queue("sized", "workflow", MAX_QUEUE_CAPACITY)
    assert capacity_of(engine, "sized") == MAX_QUEUE_CAPACITY
    engine.set_queue_capacity("default", "workflow", MAX_QUEUE_CAPACITY)
    a_run_completes(engine)
