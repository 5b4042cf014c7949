"""Held runs on every adapter (docs/reference/contract.md §11): a run whose new code does not match its history is
held, not failed — its task is retried with backoff, ``RunInfo.task_failure`` says why — and it
goes on, losing nothing, once code that matches is registered. ``on_nondeterminism="fail"``
keeps the old behaviour."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


@dex.activity
def ship_a() -> str:
    return "a"


@dex.activity
def ship_b() -> str:
    return "b"


@dex.workflow(name="shipping")
async def shipping_v1(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(ship_a)
    await ctx.wait_for_event("go")
    return first + await ctx.activity(ship_a)


@dex.workflow(name="shipping")
async def shipping_v2(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(ship_b)  # a deploy changed the first step, with no patch
    await ctx.wait_for_event("go")
    return first + await ctx.activity(ship_b)


@dex.workflow
async def healthy(ctx: dex.WorkflowContext) -> str:
    return await ctx.activity(ship_b)  # type: ignore[no-any-return]


ACTIVITIES = [ship_a, ship_b]


def _started_by_v1(make_engine: Any) -> str:
    v1 = make_engine([shipping_v1], ACTIVITIES)
    run_id = v1.start_workflow(shipping_v1)
    v1.drain()
    return run_id  # type: ignore[no-any-return]


def test_a_run_its_new_code_does_not_match_is_held_then_goes_on_with_matching_code(
    make_engine: Any, clock: VirtualClock
) -> None:
    run_id = _started_by_v1(make_engine)
    v2 = make_engine([shipping_v2, healthy], ACTIVITIES)
    v2.send_event(run_id, "go")
    started = clock.now()
    v2.drain()  # returns: drain does not wait on a held run for ever
    held = v2.get_run(run_id)
    assert held.status is dex.RunStatus.RUNNING
    assert held.failure is None
    assert held.task_failure is not None and held.task_failure.type == "NonDeterminismError"
    assert "activity 'ship_a'" in held.task_failure.message and "activity 'ship_b'" in held.task_failure.message
    assert v2.workflow_worker.holds >= 2  # its task was retried (with a backoff), and held each time
    assert clock.now() - started >= timedelta(seconds=1)  # the first retry waited out its backoff
    assert [item.kind for item in v2.history(run_id)][-1] == "WorkflowTaskCompleted"  # nothing written
    # the bad deploy harms nobody else
    other = v2.start_workflow(healthy)
    v2.drain()
    assert v2.wait(other, timeout=5) == "b"
    # code that matches the history is deployed (here: v1 again): the run goes on where it was
    fixed = make_engine([shipping_v1], ACTIVITIES)
    fixed.drain()
    assert fixed.wait(run_id, timeout=5) == "aa"
    info = fixed.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED and info.task_failure is None
    assert sum(item.kind == "ActivityTaskCreated" for item in fixed.history(run_id)) == 2  # nothing repeated


def test_on_nondeterminism_fail_fails_the_run(make_engine: Any) -> None:
    run_id = _started_by_v1(make_engine)
    v2 = make_engine([shipping_v2], ACTIVITIES, on_nondeterminism="fail")
    v2.send_event(run_id, "go")
    v2.drain()
    info = v2.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "NonDeterminismError"
    assert info.task_failure is None


@pytest.mark.parametrize("value", ["ignore", "", "hold\x00", "h\ud800", None, 1])
def test_a_bad_on_nondeterminism_is_refused(make_engine: Any, value: Any) -> None:
    with pytest.raises(ValueError, match="on_nondeterminism"):
        make_engine([healthy], ACTIVITIES, on_nondeterminism=value)
    engine = make_engine([healthy], ACTIVITIES)
    run_id = engine.start_workflow(healthy)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "b"


def test_a_store_failing_while_a_run_is_held_leaves_it_held(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _started_by_v1(make_engine)
    v2 = make_engine([shipping_v2], ACTIVITIES)
    v2.send_event(run_id, "go")
    real = v2.store.retry_workflow_tasks
    failures = []

    def failing(retries: Any, now: Any, failure: Any = None) -> list[bool]:
        if failure is not None and not failures:
            failures.append(failure)
            raise ConnectionError("the store went away while the task was given back")
        return real(retries, now, failure)  # type: ignore[no-any-return]

    monkeypatch.setattr(v2.store, "retry_workflow_tasks", failing)
    v2.drain()  # the lease expires instead; the next claim holds it again
    assert failures and failures[0].type == "NonDeterminismError"
    info = v2.get_run(run_id)
    assert info.status is dex.RunStatus.RUNNING
    assert info.task_failure is not None and info.task_failure.type == "NonDeterminismError"
    monkeypatch.undo()
    fixed = make_engine([shipping_v1], ACTIVITIES)
    fixed.drain()
    assert fixed.wait(run_id, timeout=5) == "aa"
    assert fixed.get_run(run_id).task_failure is None


def _until(check: Any, seconds: float = 15) -> None:
    """Poll ``check`` (a started engine works in its own threads) until it holds, or fail."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.02)


def test_a_held_run_on_a_started_engine_goes_on_once_an_engine_with_matching_code_starts(
    make_engine: Any, clock: VirtualClock
) -> None:
    run_id = _started_by_v1(make_engine)
    v2 = make_engine([shipping_v2, healthy], ACTIVITIES)
    v2.start()  # started, not drained: its own threads claim the run's task and hold it
    v2.send_event(run_id, "go")
    _until(lambda: v2.get_run(run_id).task_failure is not None)
    held = v2.get_run(run_id)
    assert held.status is dex.RunStatus.RUNNING and held.failure is None
    assert held.task_failure is not None and held.task_failure.type == "NonDeterminismError"
    other = v2.start_workflow(healthy)  # the started engine serves everyone else meanwhile
    assert v2.wait(other, timeout=10) == "b"
    assert v2.get_run(run_id).status is dex.RunStatus.RUNNING  # still held, not failed
    v2.stop(timeout=5)
    fixed = make_engine([shipping_v1], ACTIVITIES)
    fixed.start()
    clock.advance(timedelta(minutes=6))  # past the held task's backoff (at most five minutes)
    assert fixed.wait(run_id, timeout=15) == "aa"
    info = fixed.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED and info.task_failure is None
    assert sum(item.kind == "ActivityTaskCreated" for item in fixed.history(run_id)) == 2  # nothing repeated
