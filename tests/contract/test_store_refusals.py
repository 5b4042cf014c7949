"""Data the store refuses stays with its own task or run, on every adapter.

:class:`RefusingStore` wraps an adapter and refuses, as PostgreSQL refuses a bad value, every
batch write that holds an item carrying :data:`MARK`: a workflow result whose run set that
status, an activity outcome whose result holds it, an event whose payload holds it. The buffer
must split the batch until it finds that item, settle it alone — the run FAILED with the
reason, the activity failed for good, the sender told — and commit the rest of the batch.
A store that is merely unavailable is different: the whole batch waits for the next flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import StoreRejectedError
from dex.domain import events as ev
from dex.domain.state import fold
from dex.testing import VirtualClock
from tests.buffers import Flushers

MARK = "POISON"
LEASE = timedelta(seconds=30)


class RefusingStore:
    """An adapter that refuses batches holding :data:`MARK` (see the module docstring); with
    ``unavailable`` set, the next that many batch writes fail with ConnectionError instead."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.refused = 0
        self.unavailable = 0
        self.refuse_runs: set[str] = set()  # runs whose every result is refused, failures too

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    @property
    def clock(self) -> Any:
        return self.store.clock

    def _check(self, poisoned: bool) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        if poisoned:
            self.refused += 1
            raise StoreRejectedError("the test store refuses a value in this batch")

    def _result_poisoned(self, results: Any) -> bool:
        return any(r.custom_status == MARK or r.run_id in self.refuse_runs for _t, r in results)

    def complete_workflow_tasks(self, results: Any, now: Any) -> Any:
        self._check(self._result_poisoned(results))
        return self.store.complete_workflow_tasks(results, now)

    def complete_workflow_tasks_then_claim(self, results: Any, now: Any, claim: Any) -> Any:
        self._check(self._result_poisoned(results))
        return self.store.complete_workflow_tasks_then_claim(results, now, claim)

    def complete_activity_tasks(self, outcomes: Any, now: Any) -> Any:
        self._check(any(o.result is not None and MARK.encode() in o.result.data for o in outcomes))
        return self.store.complete_activity_tasks(outcomes, now)

    def complete_activity_tasks_then_claim(self, outcomes: Any, now: Any, claim: Any) -> Any:
        self._check(any(o.result is not None and MARK.encode() in o.result.data for o in outcomes))
        return self.store.complete_activity_tasks_then_claim(outcomes, now, claim)

    def send_messages(self, items: Any, now: Any) -> Any:
        self._check(any(isinstance(m, ev.ExternalEventReceived) and MARK.encode() in m.payload.data for _r, m in items))
        return self.store.send_messages(items, now)


@pytest.fixture
def refusing(adapter_factory: Callable[[], Any]) -> Iterator[Callable[..., tuple[dex.Engine, RefusingStore]]]:
    engines: list[dex.Engine] = []

    def make(workflows: Any, activities: Any = ()) -> tuple[dex.Engine, RefusingStore]:
        store = RefusingStore(adapter_factory())
        engine = dex.Engine(store, workflows=workflows, activities=activities)  # type: ignore[arg-type]
        engines.append(engine)
        return engine, store

    yield make
    for engine in engines:
        engine.stop(timeout=5)


@dex.workflow
async def labelled(ctx: dex.WorkflowContext, status: str) -> str:
    ctx.set_status(status)
    return status.lower()


def test_a_refused_result_fails_only_its_run_and_the_rest_of_the_batch_commits(refusing: Any) -> None:
    engine, store = refusing([labelled])
    statuses = ["A", "B", MARK, "C", "D"]
    run_ids = [engine.start_workflow(labelled, status) for status in statuses]
    engine.workflow_scheduler.step()
    assert engine.workflow_worker.poll_once() == 5  # one round: its results go out as one batch
    assert engine.buffer.flush() == 5  # one flush settles the whole batch
    assert store.refused >= 1 and len(engine.buffer) == 0
    for status, run_id in zip(statuses, run_ids, strict=True):
        info = engine.get_run(run_id)
        if status == MARK:
            assert info.status is dex.RunStatus.FAILED
            assert info.failure is not None and info.failure.type == "StoreRejectedError"
            assert "the store refused this task's result" in info.failure.message
            assert "the test store refuses a value" in info.failure.message  # the store's reason
        else:
            assert info.status is dex.RunStatus.COMPLETED and info.result == status.lower()
    with pytest.raises(dex.WorkflowFailedError, match="the store refused this task's result"):
        engine.wait(run_ids[2], timeout=1)
    history = engine.history(run_ids[2])
    assert fold(history).status is dex.RunStatus.FAILED  # a history like any other: it started, then failed
    assert [e.kind for e in history][:3] == ["RunCreated", "WorkflowTaskStarted", "RunStarted"]
    healthy = engine.start_workflow(labelled, "E")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "e"


@dex.workflow
async def parent_of(ctx: dex.WorkflowContext, status: str) -> str:
    try:
        return await ctx.child(labelled, status)  # type: ignore[no-any-return]
    except dex.ChildWorkflowFailedError as exc:
        return f"child failed: {exc.failure.type}: {exc.failure.message}"


def test_a_child_whose_result_is_refused_fails_and_its_parent_is_told(refusing: Any) -> None:
    engine, _store = refusing([parent_of, labelled])
    parent = engine.start_workflow(parent_of, MARK)
    engine.drain()
    told = engine.wait(parent, timeout=5)  # the parent does not wait forever for its child
    assert told.startswith("child failed: StoreRejectedError: the store refused this task's result")
    healthy = engine.start_workflow(parent_of, "ok")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "ok"


@dex.activity
def echo(word: str) -> str:
    return word


@dex.workflow
async def fetch(ctx: dex.WorkflowContext, word: str) -> dict[str, str]:
    try:
        return {"word": await ctx.activity(echo, word)}
    except dex.ActivityFailedError as exc:
        return {"type": exc.failure.type, "message": exc.failure.message, "terminal": str(exc.failure.terminal)}


def test_a_refused_activity_outcome_fails_only_that_activity(refusing: Any) -> None:
    engine, store = refusing([fetch], [echo])
    words = ["a", "b", MARK, "c"]
    run_ids = [engine.start_workflow(fetch, word) for word in words]
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    assert engine.activity_worker.poll_once() == 4  # the four outcomes go out as one batch
    assert engine.buffer.flush() == 4
    assert store.refused >= 1 and len(engine.buffer) == 0
    engine.drain()
    results = [engine.wait(run_id, timeout=5) for run_id in run_ids]
    assert [r.get("word") for r in results] == ["a", "b", None, "c"]
    poisoned = results[2]
    assert poisoned["type"] == "StoreRejectedError" and poisoned["terminal"] == "True"
    assert "the store refused this activity attempt's outcome" in poisoned["message"]
    healthy = engine.start_workflow(fetch, "d")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == {"word": "d"}


@dex.workflow
async def listener(ctx: dex.WorkflowContext) -> str:
    word: str = await ctx.wait_for_event("word")
    return word


def test_a_refused_event_is_reported_to_its_sender_only(refusing: Any) -> None:
    engine, _store = refusing([listener])
    run_ids = [engine.start_workflow(listener) for _ in range(3)]
    engine.drain()
    # a started engine's buffer: the senders wait for a flush, this test's, with all three
    buffer = ResultBuffer(engine.store, dispatch=Flushers())
    errors: dict[int, BaseException | None] = {}

    def send(index: int, word: str) -> None:
        try:
            buffer.send_message(
                run_ids[index], ev.ExternalEventReceived(event_id="word", payload=engine.converter.encode(word))
            )
            errors[index] = None
        except BaseException as exc:  # noqa: BLE001 - what the sender gets is the finding
            errors[index] = exc

    senders = [threading.Thread(target=send, args=(i, w)) for i, w in enumerate(["x", MARK, "z"])]
    for sender in senders:
        sender.start()
    while len(buffer) < 3:
        threading.Event().wait(0.005)
    assert buffer.flush() == 3
    for sender in senders:
        sender.join(5)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], StoreRejectedError)
    engine.drain()
    assert engine.wait(run_ids[0], timeout=5) == "x" and engine.wait(run_ids[2], timeout=5) == "z"
    assert engine.get_run(run_ids[1]).status is dex.RunStatus.RUNNING  # still waiting: nothing arrived
    engine.send_event(run_ids[1], "word", "y")
    engine.drain()
    assert engine.wait(run_ids[1], timeout=5) == "y"


def test_an_unavailable_store_keeps_the_whole_batch_for_the_next_flush(refusing: Any) -> None:
    engine, store = refusing([labelled])
    run_ids = [engine.start_workflow(labelled, status) for status in ["A", "B", "C"]]
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.unavailable = 1
    with pytest.raises(ConnectionError):
        engine.buffer.flush()
    assert len(engine.buffer) == 3 and store.unavailable == 0  # one call, not split: all kept
    assert engine.buffer.flush() == 3
    assert [engine.wait(run_id, timeout=1) for run_id in run_ids] == ["a", "b", "c"]


def test_a_result_refused_even_as_a_failure_gives_its_task_back(refusing: Any, clock: VirtualClock) -> None:
    engine, store = refusing([labelled])
    stuck = engine.start_workflow(labelled, "S")
    store.refuse_runs.add(stuck)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    assert engine.buffer.flush() == 1 and len(engine.buffer) == 0  # nothing loops on it
    assert engine.get_run(stuck).status is not dex.RunStatus.FAILED  # nothing could be written
    names = frozenset({"labelled"})
    assert store.claim_workflow_tasks(names, "other", clock.now(), timedelta(seconds=5), 1) == []  # backing off
    store.refuse_runs.clear()
    healthy = engine.start_workflow(labelled, "H")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "h"
    assert engine.wait(stuck, timeout=5) == "s"  # retried after its backoff, and written this time


def test_postgresql_refusing_a_value_fails_only_its_run(
    adapter_factory: Callable[[], Any], clock: VirtualClock
) -> None:
    """No wrapper: PostgreSQL itself refuses a NUL and a lone surrogate (the adapter says
    StoreRejectedError), and the buffer splits the batch down to the run that carries one."""
    adapter = adapter_factory()
    if isinstance(adapter, InMemoryAdapter):
        pytest.skip("PostgreSQL's own refusals")
    engine = dex.Engine(adapter, workflows=[labelled])
    run_ids = [engine.start_workflow(labelled, status) for status in ["A", "B", "C", "D"]]
    engine.workflow_scheduler.step()
    tasks = adapter.claim_workflow_tasks(frozenset({"labelled"}), engine.node_id, clock.now(), LEASE, 10)
    tasks.sort(key=lambda task: run_ids.index(task.run_id))
    results = [(task, engine.workflow_worker.execute(task)) for task in tasks]
    for bad in ("nul\x00here", "lone \ud800 surrogate"):
        doctored = [(results[1][0], attrs.evolve(results[1][1], custom_status=bad))]
        with pytest.raises(StoreRejectedError, match="PostgreSQL refused the data"):
            adapter.complete_workflow_tasks(doctored, clock.now())
    # in a batch, through the buffer: B carries the NUL, C the surrogate; A and D are written
    batch = [
        results[0],
        (results[1][0], attrs.evolve(results[1][1], custom_status="nul\x00here")),
        (results[2][0], attrs.evolve(results[2][1], custom_status="lone \ud800 surrogate")),
        results[3],
    ]
    engine.buffer.add_workflow_results(batch)
    assert engine.buffer.flush() == 4 and len(engine.buffer) == 0
    infos = [engine.get_run(run_id) for run_id in run_ids]
    ok, failed = dex.RunStatus.COMPLETED, dex.RunStatus.FAILED
    assert [i.status for i in infos] == [ok, failed, failed, ok]
    for info in (infos[1], infos[2]):
        assert info.failure is not None and info.failure.type == "StoreRejectedError"
        assert info.failure.message.startswith("the store refused this task's result: PostgreSQL refused the data")
    healthy = engine.start_workflow(labelled, "E")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "e"


def test_the_postgresql_adapter_tells_refused_data_from_an_unavailable_server() -> None:
    import psycopg
    import psycopg.errors

    from dex.adapters.postgres.refusals import refusals

    for refused in (psycopg.errors.CharacterNotInRepertoire("0x00"), psycopg.errors.NumericValueOutOfRange("big")):
        with pytest.raises(StoreRejectedError, match="PostgreSQL refused the data"), refusals():
            raise refused
    with pytest.raises(StoreRejectedError, match="surrogates not allowed at position 1"), refusals():
        "a\ud800".encode()
    # the server down, a timeout, a dropped table: the batch waits (and splitting would not help)
    for kept in (psycopg.OperationalError("server closed"), psycopg.errors.UndefinedTable("gone"), TimeoutError()):
        with pytest.raises(type(kept)), refusals():
            raise kept
