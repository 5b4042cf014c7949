"""The write buffer keeps what a failed flush could not write and sends it again; a failed load
fails only its task."""

from __future__ import annotations

import time
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock


class FlakyStore(InMemoryAdapter):
    """Refuses the next ``failures`` batch writes, as a database that is restarting would."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.failures = 0

    def complete_workflow_tasks(self, results: Any, now: Any) -> list[bool]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return super().complete_workflow_tasks(results, now)


@dex.workflow
async def short(ctx: dex.WorkflowContext) -> str:
    await ctx.sleep(1)
    return "done"


def test_a_failed_flush_is_sent_again_and_nothing_is_lost() -> None:
    store = FlakyStore()
    engine = dex.Engine(store, workflows=[short])
    run_id = engine.start_workflow(short)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.failures = 1
    with pytest.raises(ConnectionError):
        engine.buffer.flush()
    assert len(engine.buffer) == 1  # kept, not dropped
    assert engine.buffer.flush() == 1
    assert engine.buffer.discarded == 0
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "done"


def test_stop_survives_a_store_that_refuses_the_final_flush() -> None:
    store = FlakyStore()
    engine = dex.Engine(store, workflows=[short])
    engine.start_workflow(short)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.failures = 10
    engine.stop(timeout=1)  # logs, releases what it can, does not raise
    assert len(engine.buffer) == 1


class CountingStore(InMemoryAdapter):
    """Counts the batch writes of workflow results and how many results each one held."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.batches: list[int] = []

    def complete_workflow_tasks(self, results: Any, now: Any) -> list[bool]:
        self.batches.append(len(results))
        return super().complete_workflow_tasks(results, now)


@dex.workflow
async def slow_short(ctx: dex.WorkflowContext) -> str:
    time.sleep(0.05)  # the round's next task starts this much later (far below any watchdog limit)
    await ctx.sleep(1)
    return "done"


def test_a_worker_round_hands_its_results_over_together() -> None:
    """A started engine's flusher writes whatever is buffered as soon as it wakes. A round that
    handed its results over one by one would wake it on the first, and each of the three would
    go out alone, 50 ms apart; handed over together, they are one write (seen at the store)."""
    store = CountingStore()
    engine = dex.Engine(store, workflows=[slow_short])
    run_ids = [engine.start_workflow(slow_short) for _ in range(3)]
    engine.workflow_scheduler.step()  # the three tasks are due before the worker's first claim
    engine.start()
    try:
        deadline = time.monotonic() + 10
        while sum(store.batches) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.stop(timeout=5)
    assert store.batches == [3]
    engine.drain()
    assert [engine.wait(run_id, timeout=1) for run_id in run_ids] == ["done"] * 3


class BrokenLoadStore(InMemoryAdapter):
    """Answers one run's load with an error, as a connection lost mid-round would."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.broken_run: str | None = None

    def load_workflow_tasks(self, requests: Any, now: Any) -> Any:
        loaded = super().load_workflow_tasks(requests, now)
        return [
            ConnectionError("server closed the connection unexpectedly") if task.run_id == self.broken_run else item
            for (task, _after), item in zip(requests, loaded, strict=True)
        ]


def test_results_decided_before_a_failure_in_the_round_still_reach_the_buffer() -> None:
    store = BrokenLoadStore()
    engine = dex.Engine(store, workflows=[short])
    first = engine.start_workflow(short)
    second = engine.start_workflow(short)
    engine.workflow_scheduler.step()
    tasks = store.claim_workflow_tasks(frozenset({"short"}), "node", store.clock.now(), engine.workflow_worker.lease, 2)
    assert {task.run_id for task in tasks} == {first, second}
    tasks.sort(key=lambda task: task.run_id != first)  # the first run's task runs first
    store.broken_run = second
    engine.workflow_worker.hand(tasks)
    # the failed load fails that task, not the round (nor its run): it is given back for later
    assert engine.workflow_worker.poll_once(claim=False) == 2
    assert len(engine.buffer) == 1  # the first run's result
    assert engine.buffer.flush() == 1 and engine.buffer.discarded == 0
    names, now = frozenset({"short"}), store.clock.now()
    assert store.claim_workflow_tasks(names, "other", now, engine.workflow_worker.lease, 2) == []  # backing off
    store.broken_run = None
    engine.drain()
    assert [engine.wait(run_id, timeout=1) for run_id in (first, second)] == ["done", "done"]


def test_a_flusher_about_to_wait_for_work_does_not_miss_the_stop() -> None:
    """``stop()`` sets the stopping event, then wakes the buffer. A flusher that checked for work
    just before the wake must not then sleep its whole interval (it once slept 60 s, and stop
    gave up on it after 30): with ``unless`` set it does not wait at all."""
    import threading
    import time

    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[short])
    stopping = threading.Event()
    engine.buffer.wake()  # a wake that no one was waiting for is gone
    stopping.set()
    began = time.monotonic()
    engine.buffer.wait_for_work(60, unless=stopping)
    assert time.monotonic() - began < 5
    waited = time.monotonic()
    engine.buffer.wait_for_work(0.05)  # without it, the wait runs to its timeout
    assert time.monotonic() - waited >= 0.04


def test_work_wakes_the_flusher_of_its_own_lane_only() -> None:
    """A heartbeat is the activity lane's work: its flusher wakes (and a wait for any lane), the
    workflow lane's goes on sleeping (one shared condition woke both on every add, and the other
    went straight back to sleep: some three wake-ups per workflow of an I/O-bound batch)."""
    import threading
    import time
    from datetime import timedelta

    from dex.app.machinery.buffer import ACTIVITY_LANE, WORKFLOW_LANE, ResultBuffer
    from dex.app.ports.store import ActivityTask, Lease
    from dex.domain.retry import RetryPolicy
    from tests.buffers import Flushers

    store = InMemoryAdapter(clock=VirtualClock())
    buffer = ResultBuffer(store, dispatch=Flushers())  # adders leave the writing to the flushers
    woke: dict[str | None, float] = {}
    began = time.monotonic()

    def flusher(lane: str | None) -> None:
        buffer.wait_for_work(10, lane)
        woke[lane] = time.monotonic() - began

    threads = [threading.Thread(target=flusher, args=(lane,)) for lane in (ACTIVITY_LANE, WORKFLOW_LANE, None)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # all three wait
    now = store.clock.now()
    task = ActivityTask(
        task_id=1, run_id="r", created_seq=1, name="a", input=(), queue="default", priority=0, attempt=1,
        retry_policy=RetryPolicy(), lock_timeout=timedelta(minutes=5),
        lease=Lease(owner="node", until=now + timedelta(seconds=30), version=1),
    )  # fmt: skip
    assert buffer.heartbeat(task)
    threads[0].join(5)
    threads[2].join(5)
    time.sleep(0.2)
    assert set(woke) == {ACTIVITY_LANE, None}  # the workflow lane's flusher still sleeps
    buffer.wake()  # the engine stops: every flusher wakes
    threads[1].join(5)
    assert set(woke) == {ACTIVITY_LANE, WORKFLOW_LANE, None}
    assert woke[WORKFLOW_LANE] < 5
