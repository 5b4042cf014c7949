"""Poison for published values and streams (docs/reference/contract.md §14, §8), on every adapter.

Each test feeds one bad thing — a NUL or a lone surrogate in a key or a value, an exception
that cannot be printed, a BaseException from user code, a store that fails in the middle of a
read or a write — and checks both sides: the poisoned call or run gets its clear error (or
its retry), and a healthy run afterwards completes and streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import dex
from dex.app.ports.streams import StreamPage

POISONS = {"nul": "key\x00A", "surrogate": "key\ud800A"}
ONCE = dex.RetryPolicy(max_attempts=1)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Interrupted(BaseException):
    """A BaseException that user code raises (as KeyboardInterrupt would be)."""


@dex.activity(name="poison-writer", retry=ONCE)
def poison_writer(poison: str) -> str:
    dex.activity_context().write_stream(POISONS[poison], "v")
    return "wrote"


@dex.activity(name="writes-then-interrupted", retry=dex.RetryPolicy(max_attempts=3))
def writes_then_interrupted() -> int:
    context = dex.activity_context()
    context.write_stream("attempts", context.attempt)
    if context.attempt == 1:
        raise Interrupted("stop")
    return context.attempt


@dex.activity(name="odd-writer", retry=ONCE)
def odd_writer(how: str) -> None:
    context = dex.activity_context()
    if how == "opaque":
        context.write_stream("odd", object())  # no payload converter can encode it
    context.write_stream("odd", "written first")
    raise Unprintable()


@dex.workflow(name="odd-activity")
async def odd_activity(ctx: dex.WorkflowContext, how: str) -> None:
    await ctx.activity(odd_writer, how)


@dex.workflow(name="poison-publisher")
async def poison_publisher(ctx: dex.WorkflowContext, how: str, poison: str) -> None:
    key = POISONS[poison]
    if how == "publish":
        ctx.publish(key, 1)
    elif how == "write":
        await ctx.write_stream(key, 1)
    else:
        ctx.close_stream(key)


@dex.workflow(name="poison-values")
async def poison_values(ctx: dex.WorkflowContext, poison: str) -> None:
    value = POISONS[poison]
    ctx.publish("value", value)
    await ctx.write_stream("values", value)
    await ctx.write_stream("values", {value: [value]})
    ctx.close_stream("values")


@dex.workflow(name="poison-activity")
async def poison_activity(ctx: dex.WorkflowContext, poison: str) -> str:
    return await ctx.activity(poison_writer, poison)


@dex.workflow(name="interrupted-activity")
async def interrupted_activity(ctx: dex.WorkflowContext) -> int:
    return await ctx.activity(writes_then_interrupted)


@dex.workflow(name="healthy-stream")
async def healthy_stream(ctx: dex.WorkflowContext, count: int) -> int:
    ctx.publish("status", "working")
    for i in range(count):
        await ctx.write_stream("items", i)
    ctx.close_stream("items")
    return count


WORKFLOWS = [odd_activity, poison_publisher, poison_values, poison_activity, interrupted_activity, healthy_stream]
ACTIVITIES = [odd_writer, poison_writer, writes_then_interrupted]


def _engine(make_engine: Callable[..., dex.Engine]) -> dex.Engine:
    return make_engine(WORKFLOWS, ACTIVITIES)


def _healthy_run_streams(engine: dex.Engine) -> None:
    run_id = engine.start_workflow(healthy_stream, 3)
    assert list(engine.read_stream(run_id, "items", timeout=10)) == [0, 1, 2]
    assert engine.get_published(run_id, "status", timeout=10) == "working"
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 3


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_readers_refuse_a_poisoned_key(make_engine: Callable[..., dex.Engine], poison: str) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(healthy_stream, 1)
    key = POISONS[poison]
    with pytest.raises(ValueError, match="published value key"):
        engine.get_published(run_id, key)
    with pytest.raises(ValueError, match="published value key"):
        engine.watch_published(run_id, key)
    with pytest.raises(ValueError, match="stream key"):
        engine.read_stream(run_id, key)
    with pytest.raises(ValueError, match="stream key"):
        engine.read_stream_async(run_id, key)
    with pytest.raises(ValueError, match="run_id"):
        engine.read_stream("run\x00id", "items")
    _healthy_run_streams(engine)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("how", ["publish", "write", "close"])
def test_a_workflow_that_uses_a_poisoned_key_fails_alone(
    make_engine: Callable[..., dex.Engine], how: str, poison: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(poison_publisher, how, poison)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id)
    assert failed.value.failure.type == "ValueError"
    summary = engine.store.run_streams(run_id)
    assert summary.published == () and summary.streams == ()
    _healthy_run_streams(engine)


def test_a_nul_in_values_is_kept_exactly(make_engine: Callable[..., dex.Engine]) -> None:
    engine = _engine(make_engine)
    value = POISONS["nul"]
    run_id = engine.start_workflow(poison_values, "nul")
    engine.drain()
    assert engine.get_published(run_id, "value") == value
    assert list(engine.read_stream(run_id, "values")) == [value, {value: [value]}]
    _healthy_run_streams(engine)


def test_a_lone_surrogate_in_a_value_is_refused_at_the_call_and_fails_its_run_alone(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(poison_values, "surrogate")
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id)
    assert failed.value.failure.type == "SerializationError"
    summary = engine.store.run_streams(run_id)
    assert summary.published == () and summary.streams == ()
    _healthy_run_streams(engine)


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_an_activity_writing_with_a_poisoned_key_fails_alone(
    make_engine: Callable[..., dex.Engine], poison: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(poison_activity, poison)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id)
    assert "stream key" in str(failed.value)
    assert engine.store.run_streams(run_id).streams == ()
    _healthy_run_streams(engine)


@pytest.mark.parametrize("how", ["opaque", "unprintable"])
def test_an_activity_writing_what_cannot_be_encoded_or_raising_what_cannot_be_printed_fails_alone(
    make_engine: Callable[..., dex.Engine], how: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(odd_activity, how)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id)
    if how == "opaque":
        assert failed.value.failure.cause is not None
        assert failed.value.failure.cause.type == "SerializationError"
        assert engine.store.run_streams(run_id).streams == ()
    else:
        assert failed.value.failure.cause is not None
        assert failed.value.failure.cause.type == "Unprintable"
        assert list(engine.read_stream(run_id, "odd")) == ["written first"]  # what it wrote stays
    _healthy_run_streams(engine)


def test_an_attempt_interrupted_after_writing_is_retried_and_writes_again(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(interrupted_activity)
    engine.drain()
    assert engine.wait(run_id) == 2
    assert list(engine.read_stream(run_id, "attempts")) == [1, 2]  # at least once, like the activity
    _healthy_run_streams(engine)


def test_a_store_that_fails_mid_read_with_unprintable_errors_is_read_again(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(healthy_stream, 250)  # more than a page: several reads
    engine.drain()
    real = engine.store.read_stream
    calls = {"n": 0}

    def flaky(run_id: str, key: str, after: int, limit: int) -> StreamPage:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise Unprintable()
        return real(run_id, key, after, limit)

    engine.store.read_stream = flaky  # type: ignore[method-assign]
    assert list(engine.read_stream(run_id, "items", timeout=10)) == list(range(250))
    assert calls["n"] >= 5
    engine.store.read_stream = real  # type: ignore[method-assign]
    _healthy_run_streams(engine)


def test_a_reader_whose_store_keeps_failing_times_out_saying_so(make_engine: Callable[..., dex.Engine]) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(healthy_stream, 1)
    real = engine.store.read_published

    def down(run_id: str, key: str) -> Any:
        raise ConnectionError("the database went away")

    engine.store.read_published = down  # type: ignore[method-assign]
    with pytest.raises(TimeoutError, match="store was failing") as caught:
        engine.get_published(run_id, "status", timeout=0.2)
    assert isinstance(caught.value.__cause__, ConnectionError)
    engine.store.read_published = real  # type: ignore[method-assign]
    _healthy_run_streams(engine)


def test_a_base_exception_from_the_store_is_not_swallowed(make_engine: Callable[..., dex.Engine]) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(healthy_stream, 1)
    real = engine.store.read_stream

    def interrupted(*args: Any) -> Any:
        raise Interrupted("ctrl-c")

    engine.store.read_stream = interrupted  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        engine.read_stream(run_id, "items", timeout=5)
    engine.store.read_stream = real  # type: ignore[method-assign]
    _healthy_run_streams(engine)


def test_a_store_that_fails_mid_write_of_an_activity_item_retries_the_attempt(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = _engine(make_engine)
    real = engine.store.write_stream_items
    calls = {"n": 0}

    def fails_once(*args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("lost")
        real(*args)

    engine.store.write_stream_items = fails_once  # type: ignore[method-assign]
    run_id = engine.start_workflow(interrupted_activity)
    engine.drain()
    # attempt 1: its write failed, so the attempt failed (before its Interrupted) and was
    # retried; attempt 2 wrote and returned
    assert engine.wait(run_id) == 2
    assert list(engine.read_stream(run_id, "attempts")) == [2]
    engine.store.write_stream_items = real  # type: ignore[method-assign]
    _healthy_run_streams(engine)


def test_a_completion_whose_acknowledgement_is_lost_writes_its_items_once(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = _engine(make_engine)
    store: Any = engine.store
    calls = {"n": 0}
    real = {name: getattr(store, name) for name in ("complete_workflow_tasks", "complete_workflow_tasks_then_claim")}

    def lost_ack(name: str) -> Callable[..., Any]:
        def write(*args: Any) -> Any:
            answer = real[name](*args)
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("the commit's answer never came")
            return answer

        return write

    for name in real:
        setattr(store, name, lost_ack(name))
    run_id = engine.start_workflow(healthy_stream, 5)
    with pytest.raises(ConnectionError):  # drain() reports the store's error; the write stays buffered
        engine.drain()
    engine.drain()
    assert calls["n"] >= 2  # the write was made again
    assert engine.wait(run_id) == 5
    assert list(engine.read_stream(run_id, "items")) == [0, 1, 2, 3, 4]
    for name, method in real.items():
        setattr(store, name, method)
    _healthy_run_streams(engine)
