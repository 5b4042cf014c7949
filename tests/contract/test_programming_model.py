"""The programming model on every adapter: activities, timers, events, children, gather, side effects."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.testing import VirtualClock


@attrs.frozen
class Order:
    order_id: str
    amount: int


@attrs.frozen
class Receipt:
    order_id: str
    charged: int


@dex.activity(name="charge", queue="payments")
def charge(order: Order) -> Receipt:
    return Receipt(order_id=order.order_id, charged=order.amount)


@dex.activity
async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


@dex.workflow(name="checkout")
async def checkout(ctx: dex.WorkflowContext, order: Order) -> Receipt:
    return await ctx.activity(charge, order)  # type: ignore[no-any-return]


def test_attrs_values_cross_activities_and_results(make_engine: Any) -> None:
    engine = make_engine([checkout], [charge])
    run_id = engine.start_workflow(checkout, Order("o-1", 42))
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED
    assert info.result == Receipt(order_id="o-1", charged=42)
    assert engine.wait(run_id, timeout=1) == Receipt(order_id="o-1", charged=42)
    assert {q.name for q in engine.list_queues() if q.kind == "activity"} >= {"payments"}


@dex.workflow
async def doubles(ctx: dex.WorkflowContext, values: list[int]) -> list[int]:
    return await ctx.gather(*(ctx.activity(async_double, v) for v in values))  # type: ignore[no-any-return]


def test_async_activities_and_gather_keep_argument_order(make_engine: Any) -> None:
    engine = make_engine([doubles], [async_double])
    run_id = engine.start_workflow(doubles, [3, 1, 2])
    engine.drain()
    assert engine.wait(run_id, timeout=1) == [6, 2, 4]
    kinds = [e.kind for e in engine.history(run_id)]
    assert kinds.count("ActivityTaskCreated") == 3
    assert kinds.count("ActivityTaskCompleted") == 3


@dex.workflow
async def sleeper(ctx: dex.WorkflowContext) -> list[str]:
    before = ctx.now()
    await ctx.sleep(timedelta(hours=2))
    after = ctx.now()
    return [before.isoformat(), after.isoformat()]


def test_durable_timer_fires_no_earlier_than_its_delay(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([sleeper])
    run_id = engine.start_workflow(sleeper)
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    clock.advance(timedelta(hours=1))
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.drain()
    before, after = engine.get_run(run_id).result
    from datetime import datetime

    assert datetime.fromisoformat(after) - datetime.fromisoformat(before) >= timedelta(hours=2)
    assert [e.kind for e in engine.history(run_id)].count("TimerElapsed") == 1


@dex.workflow
async def collector(ctx: dex.WorkflowContext, count: int) -> list[Any]:
    return [await ctx.wait_for_event("item") for _ in range(count)]


def test_events_sent_before_the_wait_are_buffered_fifo(make_engine: Any) -> None:
    engine = make_engine([collector])
    run_id = engine.start_workflow(collector, 3)
    for item in ("a", "b"):
        engine.send_event(run_id, "item", item)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.send_event(run_id, "item", {"n": 3})
    engine.drain()
    assert engine.wait(run_id, timeout=1) == ["a", "b", {"n": 3}]


@dex.workflow
async def impatient(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_for_event("approval", timeout=timedelta(minutes=5))
    except dex.WaitTimeoutError:
        return "timed out"
    return "approved"


def test_wait_for_event_times_out(make_engine: Any) -> None:
    engine = make_engine([impatient])
    run_id = engine.start_workflow(impatient)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "timed out"


def test_event_before_timeout_wins_and_late_timer_is_harmless(make_engine: Any) -> None:
    engine = make_engine([impatient])
    run_id = engine.start_workflow(impatient)
    engine.drain(advance_time=False)
    engine.send_event(run_id, "approval", True)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "approved"


def test_events_for_missing_or_finished_runs_are_refused(make_engine: Any) -> None:
    engine = make_engine([impatient])
    with pytest.raises(dex.RunNotFoundError):
        engine.send_event("no-such-run", "approval")
    run_id = engine.start_workflow(impatient)
    engine.drain()
    with pytest.raises(dex.InvalidStateError):
        engine.send_event(run_id, "approval", True)


@dex.workflow(name="child-square")
async def child_square(ctx: dex.WorkflowContext, x: int) -> int:
    await ctx.sleep(1)
    return x * x


@dex.workflow
async def parent_of_squares(ctx: dex.WorkflowContext, n: int) -> int:
    results = await ctx.gather(*(ctx.child(child_square, i) for i in range(n)))
    return sum(results)


def test_child_workflows_return_their_results(make_engine: Any) -> None:
    engine = make_engine([parent_of_squares, child_square])
    run_id = engine.start_workflow(parent_of_squares, 4)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 0 + 1 + 4 + 9
    children = engine.list_runs(workflow_name="child-square")
    assert len(children) == 4
    assert all(c.parent_run_id == run_id and c.status is dex.RunStatus.COMPLETED for c in children)


@dex.workflow(name="child-forever")
async def child_forever(ctx: dex.WorkflowContext) -> None:
    await ctx.wait_for_event("never")


@dex.workflow
async def abandoning_parent(ctx: dex.WorkflowContext) -> str:
    ctx.child(child_forever)
    await ctx.sleep(10)
    return "done"


def test_children_are_cancelled_when_the_parent_ends(make_engine: Any) -> None:
    engine = make_engine([abandoning_parent, child_forever])
    run_id = engine.start_workflow(abandoning_parent)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "done"
    (child,) = engine.list_runs(workflow_name="child-forever")
    assert child.status is dex.RunStatus.CANCELLED


@dex.workflow(name="child-fails")
async def child_fails(ctx: dex.WorkflowContext) -> None:
    raise ValueError("child broke")


@dex.workflow
async def parent_of_failure(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.child(child_fails)
    except dex.ChildWorkflowFailedError as exc:
        return f"{exc.failure.type}: {exc.failure.message}"
    return "no failure"


def test_child_failure_reaches_the_parent(make_engine: Any) -> None:
    engine = make_engine([parent_of_failure, child_fails])
    run_id = engine.start_workflow(parent_of_failure)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "ValueError: child broke"


side_effect_calls: list[int] = []


def roll() -> int:
    side_effect_calls.append(1)
    return 4


@dex.workflow
async def with_side_effect(ctx: dex.WorkflowContext) -> list[Any]:
    value = ctx.side_effect("roll", roll)
    await ctx.sleep(1)
    await ctx.sleep(1)
    return [value, ctx.random().random(), str(ctx.uuid4())]


def test_side_effect_runs_once_and_random_is_stable_across_replays(make_engine: Any) -> None:
    side_effect_calls.clear()
    engine = make_engine([with_side_effect])
    run_id = engine.start_workflow(with_side_effect)
    engine.drain()
    value, number, uid = engine.wait(run_id, timeout=1)
    assert value == 4 and side_effect_calls == [1]  # three workflow tasks, one call
    assert 0 <= number < 1 and len(uid) == 36
    dex.testing.replay(with_side_effect, engine.history(run_id))
    assert side_effect_calls == [1]


@dex.workflow
async def status_setter(ctx: dex.WorkflowContext) -> None:
    ctx.set_status("waiting for approval")
    await ctx.wait_for_event("approve")
    ctx.set_status("approved")


def test_custom_status_is_visible(make_engine: Any) -> None:
    engine = make_engine([status_setter])
    run_id = engine.start_workflow(status_setter)
    engine.drain()
    assert engine.get_run(run_id).custom_status == "waiting for approval"
    engine.send_event(run_id, "approve")
    engine.drain()
    assert engine.get_run(run_id).custom_status == "approved"


@dex.workflow
async def counter(ctx: dex.WorkflowContext, n: int, total: int) -> int:
    if n == 0:
        return total
    await ctx.sleep(1)
    ctx.continue_as_new(n - 1, total + n)


def test_continue_as_new_keeps_the_run_id_with_a_fresh_history(make_engine: Any) -> None:
    engine = make_engine([counter])
    run_id = engine.start_workflow(counter, 5, 0)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 15
    history = engine.history(run_id)
    assert history[0].kind == "RunCreated" and history[0].event.generation == 6
    assert [e.kind for e in history].count("TimerCreated") == 0


@dex.workflow
async def premature_continue(ctx: dex.WorkflowContext) -> None:
    ctx.sleep(100)
    ctx.continue_as_new()


def test_continue_as_new_is_refused_while_steps_are_pending(make_engine: Any) -> None:
    engine = make_engine([premature_continue])
    run_id = engine.start_workflow(premature_continue)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and "continue_as_new refused" in info.failure.message


@dex.workflow
async def logs(ctx: dex.WorkflowContext) -> None:
    ctx.logger.info("step one")
    await ctx.sleep(1)
    ctx.logger.info("step two")


def test_logger_is_silent_while_replaying(make_engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine([logs])
    run_id = engine.start_workflow(logs)
    with caplog.at_level("INFO", logger="dex.workflow"):
        engine.drain()
    engine.wait(run_id, timeout=1)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("dex.workflow")]
    assert messages == ["step one", "step two"]


@dex.activity
def remember(value: str) -> str:
    return value


@dex.workflow
async def random_driven(ctx: dex.WorkflowContext) -> str:
    token = str(ctx.uuid4())
    if ctx.random().random() < 2:
        await ctx.activity(remember, token)
    return token


def test_replay_of_a_bare_history_sees_the_same_random_values(make_engine: Any) -> None:
    engine = make_engine([random_driven], [remember])
    run_id = engine.start_workflow(random_driven)
    engine.drain()
    token = engine.wait(run_id, timeout=1)
    (created,) = [e for e in engine.history(run_id) if e.kind == "ActivityTaskCreated"]
    assert token in created.event.input[0].data.decode()
    dex.testing.replay(random_driven, engine.history(run_id))
    dex.testing.replay(random_driven, engine.export_history(run_id))


@dex.workflow
async def starts_named_children(ctx: dex.WorkflowContext) -> list[str]:
    first = ctx.child(child_forever, instance_id="singleton", labels={"role": "child"})
    try:
        await ctx.child(child_forever, instance_id="singleton")
    except dex.ChildWorkflowFailedError as exc:
        outcome = exc.failure.message
    await ctx.sleep(1)
    del first
    return [outcome]


def test_a_child_whose_instance_id_is_taken_fails_in_the_parent(make_engine: Any) -> None:
    engine = make_engine([starts_named_children, child_forever])
    run_id = engine.start_workflow(starts_named_children)
    engine.drain()
    (message,) = engine.wait(run_id, timeout=1)
    assert "singleton" in message and "in use" in message
    (child,) = engine.list_runs(workflow_name="child-forever")
    assert child.labels == {"role": "child"} and child.instance_id == "singleton"
    assert child.status is dex.RunStatus.CANCELLED  # the parent ended
