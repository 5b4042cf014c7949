"""Bad input, row by row as docs/reference/bad-input.md lists it: a clear error, and nothing lost or stuck."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


@dex.activity
def square(x: int) -> int:
    return x * x


@dex.workflow
async def calls_by_name(ctx: dex.WorkflowContext, name: str, arg: Any) -> Any:
    return await ctx.activity(name, arg)


def test_an_activity_name_no_worker_knows_waits_for_one_that_does(make_engine: Any) -> None:
    only_workflows = make_engine([calls_by_name])
    run_id = only_workflows.start_workflow(calls_by_name, "square", 7)
    only_workflows.drain()
    assert only_workflows.get_run(run_id).status is dex.RunStatus.RUNNING
    assert [q.depth for q in only_workflows.list_queues() if q.kind == "activity" and q.name == "default"] == [1]
    with_activities = make_engine([calls_by_name], [square])  # e.g. the next deploy
    with_activities.drain()
    assert with_activities.wait(run_id, timeout=1) == 49


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "quote'--", "x" * 129])
def test_invalid_names_are_refused_where_they_are_used(make_engine: Any, name: str) -> None:
    engine = make_engine([calls_by_name], [square])
    with pytest.raises(ValueError, match="invalid"):
        dex.activity(name=name)(lambda: None)
    # docs/reference/contract.md §5: an unknown workflow name is NotRegisteredError; one no workflow can have is
    # also a ValueError naming the pattern
    with pytest.raises(dex.NotRegisteredError, match="invalid workflow name") as unknown:
        engine.start_workflow(name)
    assert isinstance(unknown.value, ValueError)
    run_id = engine.start_workflow(calls_by_name, name, 1)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and "invalid activity name" in info.failure.message


@pytest.mark.parametrize("queue", ["Upper", "drop table runs;--", "a b", "x" * 41, "", "quote'"])
def test_invalid_queue_names_never_reach_the_store(make_engine: Any, queue: str) -> None:
    engine = make_engine([calls_by_name], [square])
    with pytest.raises(ValueError, match="invalid queue name"):
        engine.start_workflow(calls_by_name, "square", 1, queue=queue)
    with pytest.raises(ValueError, match="invalid queue name"):
        engine.create_queue(queue, "activity")
    assert engine.list_runs() == []
    assert queue not in {q.name for q in engine.list_queues()}


def test_arguments_of_the_wrong_type_fail_the_activity_terminally(make_engine: Any) -> None:
    engine = make_engine([calls_by_name], [square])
    run_id = engine.start_workflow(calls_by_name, "square", "not a number")
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=1)
    cause = caught.value.failure.cause
    assert cause is not None and cause.type == "SerializationError" and cause.terminal
    assert "int" in cause.message


def test_wrong_argument_counts_are_refused_at_the_call(make_engine: Any) -> None:
    @dex.workflow(name="too-many-args")
    async def too_many(ctx: dex.WorkflowContext) -> Any:
        return await ctx.activity("square", 1, 2)

    engine = make_engine([too_many], [square])
    run_id = engine.start_workflow(too_many)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=1)
    assert caught.value.failure.type == "TypeError"
    assert "activity 'square' takes 1 argument(s), got 2" in caught.value.failure.message
    # where the workflow's engine does not know the activity, the worker that runs it refuses
    workflows_only = make_engine([too_many])
    other = workflows_only.start_workflow(too_many)
    workflows_only.drain()
    make_engine([], [square]).drain()
    workflows_only.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        workflows_only.wait(other, timeout=1)
    cause = caught.value.failure.cause
    assert cause is not None and cause.terminal and "takes 1 argument(s), got 2" in cause.message


hang_calls: list[int] = []


@dex.activity(lock_timeout=timedelta(seconds=5), retry=dex.RetryPolicy(max_attempts=3))
def never_returns_first_time() -> str:
    attempt = dex.activity_context().attempt
    hang_calls.append(attempt)
    return f"attempt {attempt}"


@dex.workflow
async def waits_on_hanging(ctx: dex.WorkflowContext) -> str:
    return await ctx.activity(never_returns_first_time)  # type: ignore[no-any-return]


def test_an_activity_that_never_returns_is_run_again_after_its_lease(make_engine: Any, clock: VirtualClock) -> None:
    hang_calls.clear()
    engine = make_engine([waits_on_hanging], [never_returns_first_time])
    run_id = engine.start_workflow(waits_on_hanging)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    (hung,) = engine.activity_worker.claim()  # this attempt never comes back
    clock.advance(timedelta(seconds=6))
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "attempt 2"
    assert hung.attempt == 1


def test_a_payload_that_does_not_fit_the_hint_fails_the_receiver_not_the_worker(make_engine: Any) -> None:
    @dex.workflow(name="typed-event")
    async def typed(ctx: dex.WorkflowContext, count: int) -> int:
        return count

    engine = make_engine([typed])
    run_id = engine.start_workflow(typed, "three")
    other = engine.start_workflow(typed, 3)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.FAILED
    assert engine.wait(other, timeout=1) == 3  # the worker kept serving the others


once_calls: list[int] = []


@dex.activity(lock_timeout=timedelta(seconds=5), retry=dex.RetryPolicy(max_attempts=1))
def at_most_once_attempt() -> str:
    once_calls.append(dex.activity_context().attempt)
    return "ran"


@dex.workflow
async def single_attempt(ctx: dex.WorkflowContext) -> str:
    try:
        return await ctx.activity(at_most_once_attempt)  # type: ignore[no-any-return]
    except dex.ActivityFailedError as exc:
        return exc.failure.type


def test_a_lost_lease_on_the_last_allowed_attempt_counts_as_that_attempt(make_engine: Any, clock: VirtualClock) -> None:
    once_calls.clear()
    engine = make_engine([single_attempt], [at_most_once_attempt])
    run_id = engine.start_workflow(single_attempt)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    (lost,) = engine.activity_worker.claim()  # this worker dies holding the only attempt
    clock.advance(timedelta(seconds=6))
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "LeaseExpiredError"
    assert once_calls == []  # no attempt beyond the policy ran
    assert lost.attempt == 1
