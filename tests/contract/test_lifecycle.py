"""Run lifecycle on every adapter: status machine, cancel, suspend/resume, uniqueness, keys, queues."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


@dex.workflow(name="waiter")
async def waiter(ctx: dex.WorkflowContext, tag: str = "") -> list[Any]:
    received = []
    while True:
        item = await ctx.wait_for_event("item")
        if item == "stop":
            return received
        received.append(item)


def test_status_moves_created_running_completed(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.CREATED and info.started_at is None
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.send_event(run_id, "item", "stop")
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED
    assert info.created_at <= info.started_at <= info.completed_at  # type: ignore[operator]


def test_cancel_stops_the_code_and_ends_cancelled(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain()
    engine.cancel(run_id, reason="no longer needed")
    engine.drain()
    with pytest.raises(dex.WorkflowCancelledError):
        engine.wait(run_id, timeout=1)
    kinds = [e.kind for e in engine.history(run_id)]
    assert kinds[-3:] == ["RunCancelled", "RunCompleted", "WorkflowTaskCompleted"]
    with pytest.raises(dex.InvalidStateError):
        engine.cancel(run_id)
    with pytest.raises(dex.InvalidStateError):
        engine.resume(run_id)


def test_a_created_run_can_be_cancelled_but_not_suspended(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    with pytest.raises(dex.InvalidStateError):
        engine.suspend(run_id)
    engine.cancel(run_id)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED


def test_only_a_suspended_run_can_be_resumed(make_engine: Any) -> None:
    engine = make_engine([waiter])
    created = engine.start_workflow(waiter)
    # CREATED -> RUNNING is the run starting (its first task records it), not a request: a
    # resume here had set RUNNING with no start time and a RunResumed without a suspension
    with pytest.raises(dex.InvalidStateError, match="only a SUSPENDED run can"):
        engine.resume(created)
    assert engine.get_run(created).status is dex.RunStatus.CREATED
    engine.drain()
    running = engine.get_run(created)
    assert running.status is dex.RunStatus.RUNNING and running.started_at is not None
    with pytest.raises(dex.InvalidStateError, match="only a SUSPENDED run can"):
        engine.resume(created)
    engine.send_event(created, "item", "stop")
    engine.drain()
    assert engine.wait(created, timeout=1) == []
    assert "RunResumed" not in [e.kind for e in engine.history(created)]


def test_unknown_runs_are_reported(make_engine: Any) -> None:
    engine = make_engine([waiter])
    for call in (engine.get_run, engine.cancel, engine.suspend, engine.resume, engine.history):
        with pytest.raises(dex.RunNotFoundError):
            call("00000000-0000-0000-0000-000000000000")


def test_suspend_holds_events_and_resume_releases_them_in_order(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.send_event(run_id, "item", 1)
    engine.drain()
    engine.suspend(run_id)
    assert engine.get_run(run_id).status is dex.RunStatus.SUSPENDED
    for item in (2, 3, "stop"):
        engine.send_event(run_id, "item", item)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.SUSPENDED
    with pytest.raises(dex.InvalidStateError):
        engine.suspend(run_id)
    engine.resume(run_id)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == [1, 2, 3]
    kinds = [e.kind for e in engine.history(run_id)]
    assert kinds.index("RunResumed") < kinds.index("RunSuspended") + 3  # held events follow the resume
    assert kinds.index("RunSuspended") < kinds.index("RunResumed")


def test_a_suspended_run_can_be_cancelled(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain()
    engine.suspend(run_id)
    engine.drain()
    engine.cancel(run_id)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED


def test_instance_id_is_unique_among_live_runs(make_engine: Any) -> None:
    engine = make_engine([waiter])
    first = engine.start_workflow(waiter, instance_id="order-7")
    assert engine.start_workflow(waiter, instance_id="order-7") == first
    assert len(engine.list_runs(instance_id="order-7")) == 1
    engine.drain()
    engine.send_event(first, "item", "stop")
    engine.drain()
    second = engine.start_workflow(waiter, instance_id="order-7")
    assert second != first
    assert len(engine.list_runs(instance_id="order-7")) == 2


def test_concurrency_key_runs_one_at_a_time_by_priority_then_age(make_engine: Any) -> None:
    engine = make_engine([waiter])
    low_old = engine.start_workflow(waiter, "low-old", concurrency_key="k", priority=1)
    low_new = engine.start_workflow(waiter, "low-new", concurrency_key="k", priority=1)
    high = engine.start_workflow(waiter, "high", concurrency_key="k", priority=50)
    other = engine.start_workflow(waiter, "other", concurrency_key="other-key")
    order = []
    engine.drain()
    for _ in range(3):
        running = [r for r in (low_old, low_new, high) if engine.get_run(r).status is dex.RunStatus.RUNNING]
        assert len(running) == 1
        order.append(running[0])
        engine.send_event(running[0], "item", "stop")
        engine.drain()
    assert order == [high, low_old, low_new]
    assert engine.get_run(other).status is dex.RunStatus.RUNNING


def test_priorities_are_validated(make_engine: Any) -> None:
    engine = make_engine([waiter])
    for bad in (-1, 101, 1.5, "high"):
        with pytest.raises(ValueError, match="priority"):
            engine.start_workflow(waiter, priority=bad)
    assert engine.list_runs() == []


def test_labels_and_filters(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([waiter])
    a = engine.start_workflow(waiter, labels={"team": "red", "env": "prod"})
    clock.advance(timedelta(seconds=1))
    b = engine.start_workflow(waiter, labels={"team": "blue", "env": "prod"})
    assert engine.get_run(a).labels == {"team": "red", "env": "prod"}
    assert [r.run_id for r in engine.list_runs(labels={"env": "prod"})] == [b, a]  # newest first
    assert [r.run_id for r in engine.list_runs(labels={"team": "red", "env": "prod"})] == [a]
    assert [r.run_id for r in engine.list_runs(limit=1)] == [b]
    assert [r.run_id for r in engine.list_runs(created_before=engine.get_run(b).created_at)] == [a]
    assert engine.list_runs(statuses=[dex.RunStatus.COMPLETED]) == []
    assert [r.run_id for r in engine.list_runs(workflow_name="waiter", statuses=["CREATED"])] == [b, a]


def test_unknown_names_and_bad_arguments_create_nothing(make_engine: Any) -> None:
    engine = make_engine([waiter])
    with pytest.raises(dex.NotRegisteredError):
        engine.start_workflow("nope")
    with pytest.raises(TypeError, match="takes 0 to 1 argument"):
        engine.start_workflow(waiter, "a", "b")
    with pytest.raises(dex.SerializationError, match="object"):
        engine.start_workflow(waiter, object())
    with pytest.raises(ValueError, match="queue"):
        engine.start_workflow(waiter, queue="Bad Queue; DROP TABLE")
    with pytest.raises(TypeError, match="labels"):
        engine.start_workflow(waiter, labels={"k": 1})
    with pytest.raises(ValueError, match="event id"):
        engine.send_event(engine.start_workflow(waiter), "bad event id!")
    assert len(engine.list_runs()) == 1  # only the run used for the event check


def test_invalid_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="name"):
        dex.workflow(name="has space")(waiter.__wrapped__ if hasattr(waiter, "__wrapped__") else waiter)
    with pytest.raises(ValueError, match="queue"):

        @dex.activity(queue="UPPER")
        def bad_queue() -> None: ...

    with pytest.raises(TypeError, match="async def"):

        @dex.workflow
        def not_async(ctx: dex.WorkflowContext) -> None: ...


def test_queue_pause_capacity_and_listing(make_engine: Any) -> None:
    engine = make_engine([waiter])
    engine.create_queue("bulk", "workflow", capacity=1)
    engine.pause_queue("bulk", "workflow")
    runs = [engine.start_workflow(waiter, queue="bulk") for _ in range(3)]
    engine.drain()
    assert all(engine.get_run(r).status is dex.RunStatus.CREATED for r in runs)
    (bulk,) = [q for q in engine.list_queues() if q.name == "bulk"]
    assert (bulk.kind, bulk.status, bulk.capacity) == ("workflow", "PAUSED", 1)
    engine.resume_queue("bulk", "workflow")
    engine.set_queue_capacity("bulk", "workflow", 2)
    engine.drain()
    assert all(engine.get_run(r).status is dex.RunStatus.RUNNING for r in runs)
    with pytest.raises(ValueError):
        engine.pause_queue("missing", "workflow")
    with pytest.raises(ValueError):
        engine.create_queue("x", "neither")
    with pytest.raises(ValueError):
        engine.set_queue_capacity("bulk", "workflow", 0)
