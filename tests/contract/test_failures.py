"""Failures, retries and determinism on every adapter."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock

attempts: dict[str, list[int]] = {}


def _record(name: str) -> int:
    attempt = dex.activity_context().attempt
    attempts.setdefault(name, []).append(attempt)
    return attempt


@dex.activity(retry=dex.RetryPolicy(initial_delay=timedelta(seconds=10), max_attempts=4, randomization_factor=0))
def flaky(fail_times: int) -> str:
    attempt = _record("flaky")
    if attempt <= fail_times:
        raise ConnectionError(f"attempt {attempt} failed")
    return f"ok after {attempt}"


@dex.workflow
async def uses_flaky(ctx: dex.WorkflowContext, fail_times: int) -> str:
    return await ctx.activity(flaky, fail_times)  # type: ignore[no-any-return]


def test_retryable_failures_are_retried_with_backoff(make_engine: Any, clock: VirtualClock) -> None:
    attempts.clear()
    engine = make_engine([uses_flaky], [flaky])
    start = clock.now()
    run_id = engine.start_workflow(uses_flaky, 2)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "ok after 3"
    assert attempts["flaky"] == [1, 2, 3]
    # delays of 10 s and 15 s (multiplier 1.5, no randomisation)
    assert clock.now() - start >= timedelta(seconds=25)
    kinds = [e.kind for e in engine.history(run_id)]
    assert "ActivityTaskFailed" not in kinds  # retried attempts are not history


def test_exhausted_retries_fail_the_activity(make_engine: Any) -> None:
    attempts.clear()
    engine = make_engine([uses_flaky], [flaky])
    run_id = engine.start_workflow(uses_flaky, 10)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=1)
    assert attempts["flaky"] == [1, 2, 3, 4]
    failure = caught.value.failure
    assert failure.type == "ActivityFailedError"
    assert failure.cause is not None and failure.cause.type == "ConnectionError"
    assert "attempt 4 failed" in failure.cause.message
    assert [e.kind for e in engine.history(run_id)].count("ActivityTaskFailed") == 1


@dex.activity
def refuses(kind: str) -> None:
    _record("refuses")
    if kind == "terminal":
        raise dex.TerminalError("card declined")
    raise dex.ApplicationError("try later", retry_after=timedelta(hours=1))


@dex.workflow
async def handles_failure(ctx: dex.WorkflowContext, kind: str) -> dict[str, Any]:
    try:
        await ctx.activity(refuses, kind, retry=dex.RetryPolicy(max_attempts=2))
    except dex.ActivityFailedError as exc:
        return {"type": exc.failure.type, "message": exc.failure.message, "terminal": exc.failure.terminal}
    return {}


def test_terminal_errors_stop_retries(make_engine: Any) -> None:
    attempts.clear()
    engine = make_engine([handles_failure], [refuses])
    run_id = engine.start_workflow(handles_failure, "terminal")
    engine.drain()
    assert engine.wait(run_id, timeout=1) == {"type": "TerminalError", "message": "card declined", "terminal": True}
    assert attempts["refuses"] == [1]


def test_retry_after_overrides_the_policy_delay(make_engine: Any, clock: VirtualClock) -> None:
    attempts.clear()
    engine = make_engine([handles_failure], [refuses])
    start = clock.now()
    run_id = engine.start_workflow(handles_failure, "later")
    engine.drain()
    assert engine.wait(run_id, timeout=1)["type"] == "ApplicationError"
    assert attempts["refuses"] == [1, 2]
    assert clock.now() - start >= timedelta(hours=1)


@dex.activity
def exits() -> None:
    raise SystemExit(3)


@dex.workflow
async def calls_exit(ctx: dex.WorkflowContext) -> None:
    await ctx.activity(exits, retry=dex.RetryPolicy(max_attempts=1))


def test_base_exceptions_from_activities_are_failures_not_crashes(make_engine: Any) -> None:
    engine = make_engine([calls_exit], [exits])
    run_id = engine.start_workflow(calls_exit)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.cause is not None
    assert info.failure.cause.type == "SystemExit"


@dex.workflow
async def raises(ctx: dex.WorkflowContext) -> None:
    raise KeyError("missing")


def test_an_exception_escaping_the_workflow_fails_the_run(make_engine: Any) -> None:
    engine = make_engine([raises])
    run_id = engine.start_workflow(raises)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id)
    assert caught.value.failure.type == "KeyError"
    assert "raise KeyError" in caught.value.failure.stack_trace
    assert engine.history(run_id)[-2].kind == "RunCompleted"


@dex.workflow
async def awaits_asyncio(ctx: dex.WorkflowContext) -> None:
    await asyncio.sleep(1)


@dex.workflow
async def awaits_foreign_future(ctx: dex.WorkflowContext) -> None:
    class Foreign:
        def __await__(self) -> Any:
            yield "something"

    await Foreign()


@pytest.mark.parametrize("workflow", [awaits_asyncio, awaits_foreign_future])
def test_awaiting_a_foreign_awaitable_fails_with_a_clear_message(make_engine: Any, workflow: Any) -> None:
    engine = make_engine([workflow])
    run_id = engine.start_workflow(workflow)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None
    assert "may await only what WorkflowContext returns" in info.failure.message
    assert "ctx.sleep instead of asyncio.sleep" in info.failure.message


@dex.activity
def step_a() -> str:
    return "a"


@dex.activity
def step_b() -> str:
    return "b"


@dex.workflow(name="evolving")
async def evolving_v1(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(step_a)
    await ctx.wait_for_event("continue")
    return first


@dex.workflow(name="evolving")
async def evolving_v2(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(step_b)  # a deploy changed the first step
    await ctx.wait_for_event("continue")
    return first


def test_non_deterministic_code_after_a_deploy_fails_the_run(make_engine: Any) -> None:
    old = make_engine([evolving_v1], [step_a, step_b])
    run_id = old.start_workflow(evolving_v1)
    old.drain()
    # on_nondeterminism="fail": the old behaviour (the default holds the run: test_held_runs.py)
    new = make_engine([evolving_v2], [step_a, step_b], on_nondeterminism="fail")
    new.send_event(run_id, "continue")
    new.drain()
    info = new.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "NonDeterminismError"
    assert "activity 'step_a'" in info.failure.message and "activity 'step_b'" in info.failure.message
    with pytest.raises(dex.NonDeterminismError, match="step_a"):
        dex.testing.replay(evolving_v2, old.history(run_id))


def test_replay_accepts_the_code_that_recorded_the_history(make_engine: Any) -> None:
    engine = make_engine([evolving_v1], [step_a])
    run_id = engine.start_workflow(evolving_v1)
    engine.send_event(run_id, "continue")
    engine.drain()
    assert engine.wait(run_id) == "a"
    dex.testing.replay(evolving_v1, engine.history(run_id))
    dex.testing.replay(evolving_v1, engine.export_history(run_id))
    loaded = dex.testing.load_history(engine.export_history(run_id))
    assert [e.kind for e in loaded] == [e.kind for e in engine.history(run_id)]


@dex.activity
def echo(value: Any) -> Any:
    return value


@dex.activity
def returns_an_object() -> Any:
    return object()


@dex.workflow
async def sends_bad_values(ctx: dex.WorkflowContext) -> list[str]:
    seen = []
    try:
        ctx.activity(echo, object())
    except dex.SerializationError as exc:
        seen.append(f"argument: {exc}")
    try:
        await ctx.activity(returns_an_object)
    except dex.ActivityFailedError as exc:
        seen.append(f"result: {exc.failure.type} terminal={exc.failure.terminal}")
    return seen


def test_unserialisable_values_fail_at_the_call_that_sent_them(make_engine: Any) -> None:
    engine = make_engine([sends_bad_values], [echo, returns_an_object])
    run_id = engine.start_workflow(sends_bad_values)
    engine.drain()
    argument, result = engine.wait(run_id, timeout=1)
    assert argument.startswith("argument: ") and "object" in argument
    assert result == "result: SerializationError terminal=True"
    # the refused activity call created nothing
    assert [e.event.name for e in engine.history(run_id) if e.kind == "ActivityTaskCreated"] == ["returns_an_object"]
    with pytest.raises(dex.SerializationError):
        engine.send_event(run_id, "evt", {"when": object()})


@dex.workflow
async def continues_with(ctx: dex.WorkflowContext, generation: int) -> str:
    if generation < 0:
        ctx.continue_as_new(object())  # not caught: the run fails of it
    if generation == 0:
        try:
            ctx.continue_as_new(object())  # an object of no known type cannot be serialised
        except dex.SerializationError as exc:
            caught = str(exc)
        ctx.continue_as_new(1 if caught.startswith("continue_as_new argument 0: ") else -1)
    return f"generation {generation}"


def test_continue_as_new_refuses_unserialisable_arguments_at_the_call(make_engine: Any) -> None:
    engine = make_engine([continues_with], [])
    run_id = engine.start_workflow(continues_with, 0)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "generation 1"  # caught at the call, then continued
    # uncaught, the error escapes the code and fails the run, naming the argument
    failing = engine.start_workflow(continues_with, -1)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(failing, timeout=1)
    assert failed.value.failure.type == "SerializationError"
    assert failed.value.failure.message.startswith("continue_as_new argument 0: ")
    healthy = engine.start_workflow(continues_with, 5)
    engine.drain()
    assert engine.wait(healthy, timeout=1) == "generation 5"


@dex.activity
def big_result(size: int) -> str:
    return "x" * size


@dex.workflow
async def asks_for_big_result(ctx: dex.WorkflowContext, size: int) -> str:
    try:
        await ctx.activity(big_result, size)
    except dex.ActivityFailedError as exc:
        return exc.failure.cause.message if exc.failure.cause else exc.failure.message
    return "fits"


def test_oversized_payloads_are_refused_where_they_are_sent(make_engine: Any) -> None:
    engine = make_engine([asks_for_big_result], [big_result], max_payload_size=1024)
    with pytest.raises(dex.SerializationError, match="exceeds the limit of 1024 bytes"):
        engine.start_workflow(asks_for_big_result, "y" * 2000)
    assert engine.list_runs() == []
    run_id = engine.start_workflow(asks_for_big_result, 5000)
    engine.drain()
    assert "exceeds the limit of 1024 bytes" in engine.wait(run_id, timeout=1)
    with pytest.raises(dex.SerializationError):
        engine.send_event(run_id, "e", "z" * 5000)


def test_the_default_payload_limit_is_two_mebibytes(make_engine: Any) -> None:
    engine = make_engine([asks_for_big_result], [big_result])
    with pytest.raises(dex.SerializationError, match="2097152"):
        engine.start_workflow(asks_for_big_result, "y" * (2 * 1024 * 1024 + 1))
