"""Engines with background threads, leases and crashes, on every adapter."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


@dex.activity
def add(x: int, y: int) -> int:
    return x + y


@dex.workflow
async def three_steps(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(add, x, 1)
    x = await ctx.activity(add, x, x)
    return await ctx.activity(add, x, -1)  # type: ignore[no-any-return]


def test_started_engine_runs_workflows_in_background_threads(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add], poll_interval=0.01)
    with engine:
        run_ids = [engine.start_workflow(three_steps, i) for i in range(20)]
        results = [engine.wait(r, timeout=20) for r in run_ids]
    assert results == [(i + 1) * 2 - 1 for i in range(20)]
    assert engine.buffer.discarded == 0


def test_wait_times_out_with_a_clear_error(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add])
    run_id = engine.start_workflow(three_steps, 1)
    with pytest.raises(TimeoutError, match="did not finish"):
        engine.wait(run_id, timeout=0.05)


def test_two_engines_share_one_store_and_lose_nothing(adapter_factory: Any) -> None:
    first = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add], poll_interval=0.01)
    second = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add], poll_interval=0.01)
    with first, second:
        run_ids = [first.start_workflow(three_steps, i) for i in range(30)]
        results = [second.wait(r, timeout=30) for r in run_ids]
    assert results == [(i + 1) * 2 - 1 for i in range(30)]


executions: list[int] = []


@dex.activity(lock_timeout=timedelta(seconds=30))
def slow_once(x: int) -> int:
    executions.append(dex.activity_context().attempt)
    return x


@dex.workflow
async def one_slow(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(slow_once, x)  # type: ignore[no-any-return]


def test_an_activity_whose_worker_died_runs_again_after_its_lease_expires(adapter_factory: Any) -> None:
    executions.clear()
    crashed = dex.Engine(adapter_factory(), workflows=[one_slow], activities=[slow_once])
    run_id = crashed.start_workflow(one_slow, 7)
    crashed.workflow_scheduler.step()
    crashed.workflow_worker.poll_once()
    crashed.buffer.flush()
    crashed.activity_scheduler.step()
    claimed = crashed.activity_worker.claim()
    assert len(claimed) == 1  # ... and then this worker dies without completing it
    survivor = dex.Engine(adapter_factory(), workflows=[one_slow], activities=[slow_once])
    survivor.drain(advance_time=False)
    assert executions == []  # the lease still holds
    survivor.drain()  # jumps to the lease expiry
    assert survivor.wait(run_id, timeout=1) == 7
    assert executions == [2]
    # the dead worker's late completion is discarded
    crashed.buffer.add_activity_outcome(crashed.activity_worker.execute(claimed[0]))
    crashed.buffer.flush()
    assert crashed.buffer.discarded == 1
    assert [e.kind for e in survivor.history(run_id)].count("ActivityTaskCompleted") == 1


@dex.activity(lock_timeout=timedelta(seconds=10))
def heartbeating(clock_steps: int) -> str:
    ctx = dex.activity_context()
    for _ in range(clock_steps):
        HEARTBEAT_CLOCK[0].advance(timedelta(seconds=6))
        assert ctx.heartbeat()
    return "alive"


HEARTBEAT_CLOCK: list[VirtualClock] = []


@dex.workflow
async def uses_heartbeats(ctx: dex.WorkflowContext) -> str:
    return await ctx.activity(heartbeating, 5)  # type: ignore[no-any-return]


def test_heartbeats_keep_the_lease_alive(adapter_factory: Any, clock: VirtualClock) -> None:
    HEARTBEAT_CLOCK[:] = [clock]
    engine = dex.Engine(adapter_factory(), workflows=[uses_heartbeats], activities=[heartbeating])
    run_id = engine.start_workflow(uses_heartbeats)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    (task,) = engine.activity_worker.claim()
    # 30 virtual seconds pass inside the activity, well past the 10 s lock timeout
    outcome = engine.activity_worker.execute(task)
    assert outcome.result is not None
    rival = dex.Engine(adapter_factory(), workflows=[uses_heartbeats], activities=[heartbeating])
    assert rival.activity_worker.claim() == []  # the heartbeats kept it
    engine.buffer.add_activity_outcome(outcome)
    engine.buffer.flush()
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "alive"


def test_graceful_stop_loses_nothing_it_acknowledged(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add], poll_interval=0.01)
    engine.start()
    run_ids = [engine.start_workflow(three_steps, i) for i in range(50)]
    engine.stop()
    # whatever was in flight was flushed; a fresh engine finishes the rest
    successor = dex.Engine(adapter_factory(), workflows=[three_steps], activities=[add], poll_interval=0.01)
    with successor:
        results = [successor.wait(r, timeout=30) for r in run_ids]
    assert results == [(i + 1) * 2 - 1 for i in range(50)]


@dex.workflow
async def counts_events(ctx: dex.WorkflowContext, expected: int) -> int:
    total = 0
    for _ in range(expected):
        total += await ctx.wait_for_event("n")
    return total


def test_events_from_many_threads_share_batches_and_all_arrive(adapter_factory: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    engine = dex.Engine(adapter_factory(), workflows=[counts_events], poll_interval=0.01)
    with engine:
        run_id = engine.start_workflow(counts_events, 40)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: engine.send_event(run_id, "n", i), range(40)))
        with pytest.raises(dex.RunNotFoundError):
            engine.send_event("missing-run", "n", 1)  # errors still reach the sender
        assert engine.wait(run_id, timeout=20) == sum(range(40))
        with pytest.raises(dex.InvalidStateError):
            engine.send_event(run_id, "n", 1)
