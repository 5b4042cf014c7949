"""Whole engines on PostgresAdapter: the same histories as the in-memory adapter, and engines
sharing one database."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.adapters.postgres import PostgresAdapter
from dex.app.ports.store import Store
from dex.testing import VirtualClock

pytestmark = pytest.mark.postgres

MakeAdapter = Callable[..., PostgresAdapter]


@dex.activity(name="double", queue="a-b_1")
def double(x: int) -> int:
    return 2 * x


_flaky_calls: dict[str, int] = {}


@dex.activity(name="flaky", queue="acts", retry=dex.RetryPolicy(max_attempts=3, initial_delay=timedelta(seconds=1)))
def flaky(key: str) -> str:
    _flaky_calls[key] = _flaky_calls.get(key, 0) + 1
    if _flaky_calls[key] == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@dex.workflow(name="kid", queue="a-b_1")
async def kid(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(double, x) + 1


@dex.workflow(name="order", queue="main")
async def order(ctx: dex.WorkflowContext, x: int) -> dict[str, Any]:
    doubled = await ctx.activity(double, x)
    await ctx.sleep(timedelta(hours=1))
    approval = await ctx.wait_for_event("approve")
    child = await ctx.child(kid, doubled)
    retried = await ctx.activity(flaky, ctx.run_id)
    ctx.set_status("shipped")
    return {"doubled": doubled, "approval": approval, "child": child, "retried": retried, "at": ctx.now().isoformat()}


@dex.workflow(name="counter", queue="main")
async def counter(ctx: dex.WorkflowContext, n: int) -> int:
    if n >= 2:
        return n
    await ctx.activity(double, n)
    ctx.continue_as_new(n + 1)


@dex.workflow(name="waiter", queue="main")
async def waiter(ctx: dex.WorkflowContext) -> str:
    return str(await ctx.wait_for_event("go", timeout=timedelta(minutes=5)))


@dex.workflow(name="carry", queue="main")
async def carry(ctx: dex.WorkflowContext, generation: int) -> list[str]:
    if generation == 0:
        await ctx.sleep(60)
        ctx.continue_as_new(1)
    return [await ctx.wait_for_event("note"), await ctx.wait_for_event("note")]


WORKFLOWS: list[Callable[..., Any]] = [order, kid, counter, waiter, carry]
ACTIVITIES: list[Callable[..., Any]] = [double, flaky]


def scenario(adapter: Store, clock: VirtualClock) -> list[Any]:
    """Runs one story and returns everything a user could observe about it."""
    _flaky_calls.clear()
    engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES, rng=random.Random(7))
    runs = {
        "order": engine.start_workflow(order, 5),
        "counter": engine.start_workflow(counter, 0, labels={"team": "a"}),
        "suspended": engine.start_workflow(waiter),
        "cancelled": engine.start_workflow(waiter),
        "timeout": engine.start_workflow(waiter),
    }
    engine.drain(advance_time=False)
    engine.suspend(runs["suspended"])
    engine.send_event(runs["suspended"], "go", "held")
    engine.cancel(runs["cancelled"], "no longer needed")
    engine.drain(advance_time=False)
    observed: list[Any] = [engine.get_run(runs["suspended"]).status]
    engine.resume(runs["suspended"])
    engine.drain()  # jumps the clock over the hour-long timer and the 5-minute wait
    engine.send_event(runs["order"], "approve", {"by": "ann"})
    engine.drain()
    for name, run_id in sorted(runs.items()):
        info = engine.get_run(run_id)
        failure = info.failure.type if info.failure is not None else None
        kinds = [event.kind for event in engine.history(run_id)]
        observed.append((name, info.status, info.result, failure, info.custom_status, kinds))
    children = engine.list_runs(workflow_name="kid")
    observed.append([(c.status, c.result, c.parent_run_id == runs["order"]) for c in children])
    observed.append([r.run_id for r in engine.list_runs(labels={"team": "a"})] == [runs["counter"]])
    observed.append([(q.name, q.kind, q.depth) for q in engine.list_queues()])
    observed.append(adapter.next_due_time(clock.now()))
    return observed


def test_an_engine_on_postgres_behaves_as_on_memory(make_adapter: MakeAdapter) -> None:
    memory_clock, pg_clock = VirtualClock(), VirtualClock()
    expected = scenario(InMemoryAdapter(clock=memory_clock), memory_clock)
    observed = scenario(make_adapter(clock=pg_clock), pg_clock)
    assert observed == expected
    assert memory_clock.now() == pg_clock.now()
    order_row = next(row for row in observed if isinstance(row, tuple) and row[0] == "order")
    assert order_row[1] is dex.RunStatus.COMPLETED
    assert order_row[2]["child"] == 21 and order_row[2]["approval"] == {"by": "ann"}


def continue_as_new_scenario(adapter: Store, clock: VirtualClock) -> tuple[Any, list[str]]:
    engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
    run_id = engine.start_workflow(carry, 0)
    engine.drain(advance_time=False)
    engine.send_event(run_id, "note", "early")  # taken by the next task, then carried over
    clock.advance(60)
    engine.workflow_scheduler.step()
    [task] = adapter.claim_workflow_tasks({"carry"}, "w", clock.now(), timedelta(seconds=30), 1)
    result = engine.workflow_worker.execute(task)
    assert result.new_history is not None  # the task continues as new
    engine.send_event(run_id, "note", "late")  # arrives while the task runs: kept in the inbox
    assert adapter.complete_workflow_tasks([(task, result)], clock.now()) == [True]
    engine.drain()
    return engine.get_run(run_id).result, [event.kind for event in engine.history(run_id)]


def test_continue_as_new_keeps_unconsumed_events_as_on_memory(make_adapter: MakeAdapter) -> None:
    memory_clock, pg_clock = VirtualClock(), VirtualClock()
    expected = continue_as_new_scenario(InMemoryAdapter(clock=memory_clock), memory_clock)
    assert sorted(expected[0]) == ["early", "late"]
    assert continue_as_new_scenario(make_adapter(clock=pg_clock), pg_clock) == expected


def test_the_history_survives_a_new_adapter(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    engine = dex.Engine(make_adapter(), workflows=WORKFLOWS, activities=ACTIVITIES)
    run_id = engine.start_workflow(order, 1)
    engine.drain(advance_time=False)
    # a restarted process: new pool, new engine, same schema
    restarted = dex.Engine(make_adapter(), workflows=WORKFLOWS, activities=ACTIVITIES)
    restarted.drain()
    restarted.send_event(run_id, "approve", True)
    restarted.drain()
    assert restarted.wait(run_id, timeout=5)["child"] == 5
    exported = dex.testing.load_history(restarted.export_history(run_id))
    assert exported == restarted.history(run_id)


def test_two_engines_share_one_database(make_adapter: MakeAdapter) -> None:
    from dex.app.ports.clock import SystemClock

    engines = [
        dex.Engine(make_adapter(clock=SystemClock()), workflows=WORKFLOWS, activities=ACTIVITIES, poll_interval=0.01)
        for _ in range(2)
    ]
    run_ids = [engines[i % 2].start_workflow(kid, i) for i in range(30)]
    with engines[0], engines[1]:
        results = [engines[0].wait(run_id, timeout=30) for run_id in run_ids]
    assert results == [2 * i + 1 for i in range(30)]
    leaders = [engine.leader.is_leader for engine in engines]
    assert leaders == [False, False]  # stop() released the lease
    for run_id in run_ids:
        kinds = [event.kind for event in engines[1].history(run_id)]
        assert kinds.count("RunCompleted") == 1 and kinds.count("ActivityTaskCompleted") == 1


def test_concurrent_workers_race_on_one_run_and_one_outcome_wins(
    make_adapter: MakeAdapter, clock: VirtualClock
) -> None:
    engines = [
        dex.Engine(make_adapter(), workflows=WORKFLOWS, activities=ACTIVITIES, node_id=f"n{i}") for i in range(2)
    ]
    run_id = engines[0].start_workflow(waiter)
    engines[0].drain(advance_time=False)
    engines[0].send_event(run_id, "go", "x")
    engines[0].workflow_scheduler.step()
    # both workers decide the same task: the second claims it after the first one's lease expired
    [first] = engines[0].store.claim_workflow_tasks({"waiter"}, "n0", clock.now(), timedelta(seconds=5), 1)
    first_result = engines[0].workflow_worker.execute(first)
    clock.advance(6)
    [second] = engines[1].store.claim_workflow_tasks({"waiter"}, "n1", clock.now(), timedelta(seconds=5), 1)
    second_result = engines[1].workflow_worker.execute(second)
    barrier = threading.Barrier(2)
    applied: dict[str, list[bool]] = {}

    def complete(name: str, engine: dex.Engine, task: Any, result: Any) -> None:
        barrier.wait()
        applied[name] = engine.store.complete_workflow_tasks([(task, result)], clock.now())

    threads = [
        threading.Thread(target=complete, args=("first", engines[0], first, first_result)),
        threading.Thread(target=complete, args=("second", engines[1], second, second_result)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert applied == {"first": [False], "second": [True]}
    kinds = [event.kind for event in engines[1].history(run_id)]
    assert kinds.count("RunCompleted") == 1
    assert engines[1].get_run(run_id).result == "x"
