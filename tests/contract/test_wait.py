"""``wait`` on every adapter: a run this engine ended is answered from what its own write
recorded (no read of the store); any other run is read from the store, with the same answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import dex
from dex.app.info import Outcomes
from dex.domain import events as ev


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: str
    total: int


@dex.workflow(name="receipt")
async def receipt(ctx: dex.WorkflowContext, order: str) -> Receipt:
    return Receipt(order=order, total=len(order))


@dex.workflow(name="refuses")
async def refuses(ctx: dex.WorkflowContext) -> None:
    raise ValueError("no such order")


@dex.workflow(name="sleeps")
async def sleeps(ctx: dex.WorkflowContext) -> None:
    await ctx.sleep(3600)


def counting_reads(engine: dex.Engine) -> list[str]:
    """Count the runs ``engine`` reads from its store (a wrapper on the adapter instance)."""
    reads: list[str] = []
    read = engine.store.get_run

    def get_run(run_id: str) -> Any:
        reads.append(run_id)
        return read(run_id)

    engine.store.get_run = get_run  # type: ignore[method-assign]
    return reads


def test_wait_answers_from_the_outcomes_this_engine_wrote(make_engine: Any) -> None:
    engine = make_engine([receipt, refuses, sleeps])
    done, failed = engine.start_workflow(receipt, "a-17"), engine.start_workflow(refuses)
    cancelled = engine.start_workflow(sleeps)
    engine.drain(advance_time=False)
    engine.cancel(cancelled)
    engine.drain(advance_time=False)
    reads = counting_reads(engine)
    assert engine.wait(done, timeout=1) == Receipt(order="a-17", total=4)  # decoded with the return hint
    with pytest.raises(dex.WorkflowFailedError) as failure:
        engine.wait(failed, timeout=1)
    assert failure.value.failure.type == "ValueError" and "no such order" in failure.value.failure.message
    with pytest.raises(dex.WorkflowCancelledError):
        engine.wait(cancelled, timeout=1)
    assert reads == []


def test_another_engine_reads_the_outcome_from_the_store(make_engine: Any) -> None:
    worker, client = make_engine([receipt, refuses]), make_engine([receipt, refuses])
    done, failed = client.start_workflow(receipt, "b-2"), client.start_workflow(refuses)
    worker.drain(advance_time=False)
    reads = counting_reads(client)
    assert client.wait(done, timeout=1) == Receipt(order="b-2", total=3)
    with pytest.raises(dex.WorkflowFailedError) as failure:
        client.wait(failed, timeout=1)
    assert failure.value.failure.type == "ValueError"
    assert reads == [done, failed]


def test_a_live_run_is_read_until_it_ends(make_engine: Any) -> None:
    engine = make_engine([sleeps])
    run_id = engine.start_workflow(sleeps)
    engine.drain(advance_time=False)
    reads = counting_reads(engine)
    with pytest.raises(TimeoutError):
        engine.wait(run_id, timeout=0.05)
    assert reads and set(reads) == {run_id}


def test_outcomes_keep_only_the_newest() -> None:
    outcomes = Outcomes(capacity=3)
    completed = ev.RunCompleted(status=dex.RunStatus.COMPLETED)
    for n in range(5):
        outcomes.record(f"run-{n}", "wf", completed)
    outcomes.record("run-2", "wf", completed)  # seen again: the newest now
    outcomes.record("run-5", "wf", completed)
    assert len(outcomes) == 3
    assert [outcomes.get(f"run-{n}") is not None for n in range(6)] == [False, False, True, False, True, True]
    assert outcomes.get("run-5") == ("wf", completed)
