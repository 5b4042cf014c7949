"""``wait`` on every adapter: a run this engine ended is answered from what its own write
recorded (no read of the store); any other run is read from the store, with the same answer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any

import pytest

import dex
from dex.app.facade.info import Outcomes
from dex.app.facade.reads import RunReads
from dex.domain import events as ev
from tests.faults import FaultyStore


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


def counting_reads(engine: dex.Engine) -> list[list[str]]:
    """The runs ``engine`` reads from its store, one list per read (wrappers on the adapter
    instance's ``get_run`` and ``get_runs``)."""
    reads: list[list[str]] = []
    read_one, read_many = engine.store.get_run, engine.store.get_runs

    def get_run(run_id: str) -> Any:
        reads.append([run_id])
        return read_one(run_id)

    def get_runs(run_ids: Any) -> Any:
        reads.append(list(run_ids))
        return read_many(run_ids)

    engine.store.get_run = get_run  # type: ignore[method-assign]
    engine.store.get_runs = get_runs  # type: ignore[method-assign]
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
    # the client started both: its first read takes the other's end along, the second wait reads nothing
    assert reads == [[done, failed]]


def test_a_client_reads_the_runs_it_started_ahead_in_one_read(make_engine: Any) -> None:
    worker, client = make_engine([receipt, refuses, sleeps]), make_engine([receipt, refuses, sleeps])
    orders = [client.start_workflow(receipt, f"c-{n}") for n in range(3)]
    failed, live = client.start_workflow(refuses), client.start_workflow(sleeps)
    worker.drain(advance_time=False)
    reads = counting_reads(client)
    assert [client.wait(run_id, timeout=1) for run_id in orders] == [Receipt(order=f"c-{n}", total=3) for n in range(3)]
    with pytest.raises(dex.WorkflowFailedError):
        client.wait(failed, timeout=1)  # a failure read ahead is raised as if read now
    assert reads == [[*orders, failed, live]]  # one read; the live run was not taken for ended
    with pytest.raises(TimeoutError):
        client.wait(live, timeout=0.05)
    assert all(read == [live] for read in reads[1:])  # still live: read again, alone


def test_a_run_read_ahead_is_forgotten_when_it_is_gone(make_engine: Any) -> None:
    client = make_engine([receipt])
    first, second = client.start_workflow(receipt, "d-1"), client.start_workflow(receipt, "d-2")
    client.drain(advance_time=False)  # this engine ended both: answered from its own record
    reads = counting_reads(client)
    assert client.wait(second, timeout=1) == Receipt(order="d-2", total=3)
    assert client.wait(first, timeout=1) == Receipt(order="d-1", total=3)
    assert reads == []
    with pytest.raises(dex.RunNotFoundError):
        client.wait("no-such-run", timeout=1)
    assert reads == [["no-such-run"]]  # nothing of its own left unseen to read along


def test_get_runs_returns_the_runs_that_exist(make_engine: Any) -> None:
    engine = make_engine([receipt])
    a, b = engine.start_workflow(receipt, "e-1"), engine.start_workflow(receipt, "e-2")
    records = engine.store.get_runs([b, "missing", a, b])
    assert sorted(record.run_id for record in records) == sorted([a, b])
    assert engine.store.get_runs([]) == []


def test_a_live_run_is_read_until_it_ends(make_engine: Any) -> None:
    engine = make_engine([sleeps])
    run_id = engine.start_workflow(sleeps)
    engine.drain(advance_time=False)
    reads = counting_reads(engine)
    with pytest.raises(TimeoutError):
        engine.wait(run_id, timeout=0.05)
    assert reads and all(read == [run_id] for read in reads)


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


# -- a store that fails for a while (docs/reference/contract.md §8: the store's faults are not the caller's) ---------
def waiting_client(adapter_factory: Any) -> tuple[dex.Engine, FaultyStore]:
    """An engine that only waits, over a store whose calls all fail while ``enabled``
    (a lost connection or a timeout, as :class:`tests.faults.FaultyStore` injects them)."""
    store = FaultyStore(adapter_factory(), rate=1.0, seed=7, weights={"before": 0.7, "timeout": 0.3})
    client = dex.Engine(store, workflows=[receipt, refuses])  # type: ignore[arg-type]
    return client, store


@pytest.mark.parametrize("facade", ["sync", "async"])
def test_wait_reads_again_while_the_store_fails_and_returns_the_result(
    make_engine: Any, adapter_factory: Any, facade: str
) -> None:
    worker = make_engine([receipt, refuses])
    client, store = waiting_client(adapter_factory)
    done, failed = worker.start_workflow(receipt, "a-17"), worker.start_workflow(refuses)
    store.enabled = True  # every read of the client's fails ...

    def meanwhile() -> None:
        time.sleep(0.2)
        worker.drain(advance_time=False)  # ... while the runs end elsewhere ...
        time.sleep(0.2)
        store.enabled = False  # ... and then the store answers again

    helper = threading.Thread(target=meanwhile)
    helper.start()
    try:
        if facade == "sync":
            got = client.wait(done, timeout=10)
        else:
            got = asyncio.run(client.wait_async(done, timeout=10))
    finally:
        helper.join()
    assert got == Receipt(order="a-17", total=4)
    assert store.injected["before"] and store.injected["timeout"], store.injected  # both kinds struck the wait
    with pytest.raises(dex.WorkflowFailedError, match="no such order"):
        client.wait(failed, timeout=5)

    healthy = worker.start_workflow(receipt, "b-2")  # a run afterwards: the same wait, no faults
    worker.drain(advance_time=False)
    assert client.wait(healthy, timeout=5) == Receipt(order="b-2", total=3)


@pytest.mark.parametrize("facade", ["sync", "async"])
def test_wait_on_a_store_that_always_fails_times_out_naming_the_store_failure(
    make_engine: Any, adapter_factory: Any, caplog: pytest.LogCaptureFixture, facade: str
) -> None:
    worker = make_engine([receipt, refuses])
    client, store = waiting_client(adapter_factory)
    run_id = worker.start_workflow(receipt, "c-3")
    store.enabled = True
    began = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="dex.reads"), pytest.raises(TimeoutError) as raised:
        if facade == "sync":
            client.wait(run_id, timeout=0.5)
        else:
            asyncio.run(client.wait_async(run_id, timeout=0.5))
    took = time.monotonic() - began
    assert 0.45 < took < 1.5, took
    assert "the store was failing" in str(raised.value)
    assert "injected fault" in str(raised.value)
    assert isinstance(raised.value.__cause__, (ConnectionError, TimeoutError))
    assert "injected fault" in str(raised.value.__cause__)
    logged = [r for r in caplog.records if r.name == "dex.reads"]
    assert [r.levelno for r in logged[:2]] == [logging.INFO, logging.DEBUG], logged  # the first at INFO
    assert all(r.levelno == logging.DEBUG for r in logged[1:])
    assert run_id in logged[0].getMessage()

    store.enabled = False  # the store is back: the same run, and a healthy one, complete
    worker.drain(advance_time=False)
    assert client.wait(run_id, timeout=5) == Receipt(order="c-3", total=3)


def test_wait_for_an_unknown_run_still_raises_at_once(adapter_factory: Any) -> None:
    client, store = waiting_client(adapter_factory)
    for call in (lambda: client.wait("no-such-run", timeout=10),
                 lambda: asyncio.run(client.wait_async("no-such-run", timeout=10))):  # fmt: skip
        began = time.monotonic()
        with pytest.raises(dex.RunNotFoundError):
            call()
        assert time.monotonic() - began < 1
    # nor is a bad id a store failure to retry
    with pytest.raises(ValueError, match="NUL"):
        asyncio.run(client.wait_async("a\x00b", timeout=10))
    assert not store.injected


def test_flushes_wake_a_wait_without_making_it_read_the_store(make_engine: Any) -> None:
    """A flush of this engine's that did not end the run is answered from memory: the store is
    read on the wait's backoff clock (2 ms growing to 50 ms), not once per flush. The engine's
    read service is built here over the engine's store, so that the test can flush it as
    often as it likes (what each flush of a started engine does)."""
    engine = make_engine([sleeps, receipt])
    live = engine.start_workflow(sleeps)
    engine.drain(advance_time=False)
    run_reads = RunReads(engine.store, engine.registry, engine.converter)
    reads = counting_reads(engine)
    outcomes: list[BaseException] = []

    def wait() -> None:
        try:
            run_reads.wait(live, timeout=0.3)
        except TimeoutError as exc:
            outcomes.append(exc)

    waiting = threading.Thread(target=wait)
    waiting.start()
    flushes = 0
    while waiting.is_alive():
        run_reads.flushed()
        flushes += 1
        time.sleep(0.0005)
    assert flushes > 100 and len(outcomes) == 1  # the run is live: the wait timed out
    assert 1 <= len(reads) <= 15, reads  # the backoff's reads in 0.3 s, whatever the flushes
    healthy = engine.start_workflow(receipt, "after")
    engine.drain(advance_time=False)
    assert engine.wait(healthy, timeout=1) == Receipt(order="after", total=5)
