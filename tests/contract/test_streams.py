"""Published values and streams on every adapter (docs/reference/contract.md §14): what a run
publishes and streams is kept by the store with its history and read from outside, in order,
without reading the history; readers of a not-started engine drive it themselves."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.domain import events as ev
from dex.testing import VirtualClock


@dex.activity(name="stream-steps")
def stream_steps(count: int) -> int:
    for i in range(count):
        dex.activity_context().write_stream("activity", {"n": i})
    return count


@dex.workflow(name="progress")
async def progress(ctx: dex.WorkflowContext, count: int) -> str:
    ctx.publish("stage", "started")
    for i in range(count):
        await ctx.write_stream("progress", i)
    ctx.close_stream("progress")
    ctx.publish("stage", "streamed")
    await ctx.wait_for_event("finish")
    ctx.publish("stage", "finished")
    return "done"


@dex.workflow(name="streams-from-activity")
async def from_activity(ctx: dex.WorkflowContext, count: int) -> int:
    await ctx.write_stream("activity", "from the workflow")
    return await ctx.activity(stream_steps, count)


@dex.workflow(name="publishes-nothing")
async def publishes_nothing(ctx: dex.WorkflowContext) -> None:
    await ctx.wait_for_event("go")


@dex.workflow(name="streams-and-waits")
async def streams_and_waits(ctx: dex.WorkflowContext) -> None:
    await ctx.write_stream("s", "first")
    await ctx.wait_for_event("go")
    await ctx.write_stream("s", "second")


@dex.workflow(name="generations")
async def generations(ctx: dex.WorkflowContext, generation: int) -> int:
    await ctx.write_stream("log", f"generation {generation}")
    ctx.publish("generation", generation)
    if generation < 3:
        ctx.continue_as_new(generation + 1)
    return generation


@dex.workflow(name="closes-then-activity")
async def closes_then_activity(ctx: dex.WorkflowContext) -> int:
    ctx.close_stream("activity")
    return await ctx.activity(stream_steps, 1)


@dex.workflow(name="closes-then-continues")
async def closes_then_continues(ctx: dex.WorkflowContext, generation: int) -> str:
    if generation == 1:
        await ctx.write_stream("log", "before the close")
        ctx.close_stream("log")
        ctx.continue_as_new(2)
    try:
        await ctx.write_stream("log", "after the close")
    except ValueError as exc:
        await ctx.write_stream("other", "still writable")
        return str(exc)
    return "written"


ALL = [progress, from_activity, publishes_nothing, streams_and_waits, generations, closes_then_activity]
ALL.append(closes_then_continues)


def test_the_latest_published_value_is_read_and_streams_end_when_closed(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(progress, 3)
    # nothing drained yet: the reader drives the engine, as drain(advance_time=False) does
    assert engine.get_published(run_id, "stage", timeout=10) == "streamed"
    assert list(engine.read_stream(run_id, "progress", timeout=10)) == [0, 1, 2]
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.send_event(run_id, "finish")
    engine.drain()
    assert engine.get_published(run_id, "stage") == "finished"
    assert engine.wait(run_id) == "done"
    summary = engine.store.run_streams(run_id)
    assert [key for key, _ in summary.published] == ["stage"]
    assert [(s.key, s.length, s.closed) for s in summary.streams] == [("progress", 3, True)]


def test_a_stream_that_is_never_closed_ends_with_its_run(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(streams_and_waits)
    engine.drain()
    reader = engine.read_stream(run_id, "s", timeout=10)
    assert next(reader) == "first"
    engine.send_event(run_id, "go")  # the reader drives the engine on: the second item, then the end
    assert list(reader) == ["second"]
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED


def test_a_reader_of_a_stream_with_nothing_new_times_out(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(streams_and_waits)
    reader = engine.read_stream(run_id, "s", timeout=0.2)
    assert next(reader) == "first"
    with pytest.raises(TimeoutError, match="had no new item"):
        next(reader)
    with pytest.raises(TimeoutError):
        list(engine.read_stream(run_id, "never-written", timeout=0.1))


def test_get_published_waits_for_a_first_value_then_times_out(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(publishes_nothing)
    with pytest.raises(TimeoutError, match="published no 'stage'"):
        engine.get_published(run_id, "stage", timeout=0.2)
    engine.send_event(run_id, "go")
    engine.drain()
    with pytest.raises(dex.InvalidStateError, match="without publishing"):
        engine.get_published(run_id, "stage")  # ended: it never will


def test_activities_write_to_their_runs_streams(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(from_activity, 3)
    engine.drain()
    assert engine.wait(run_id) == 3
    assert list(engine.read_stream(run_id, "activity")) == ["from the workflow", {"n": 0}, {"n": 1}, {"n": 2}]


def test_an_activity_writing_to_a_closed_stream_fails_and_the_items_are_not_kept(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(closes_then_activity)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id)
    assert "is closed" in str(failed.value)
    assert list(engine.read_stream(run_id, "activity")) == []


def test_positions_go_on_across_continue_as_new(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(generations, 1)
    engine.drain()
    assert engine.wait(run_id) == 3
    assert list(engine.read_stream(run_id, "log")) == ["generation 1", "generation 2", "generation 3"]
    assert engine.get_published(run_id, "generation") == 3
    page = engine.store.read_stream(run_id, "log", 1, 10)
    assert [position for position, _ in page.items] == [2, 3]


def test_a_stream_closed_in_one_generation_is_closed_to_the_next_ones_code(
    make_engine: Callable[..., dex.Engine],
) -> None:
    """Contract: a closed stream stays closed across continue-as-new, and writing to a stream the
    code closed is a ValueError at the call: the next generation's code gets it too (it once
    wrote on, and the store dropped the item silently). Its history replays."""
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(closes_then_continues, 1)
    engine.drain()
    said = engine.wait(run_id)
    assert said == "stream 'log' is closed by an earlier generation of the run: nothing more can be written to it"
    assert list(engine.read_stream(run_id, "log")) == ["before the close"]
    assert list(engine.read_stream(run_id, "other")) == ["still writable"]
    history = engine.history(run_id)
    created = history[0].event
    assert isinstance(created, ev.RunCreated) and created.generation == 2 and created.closed_streams == ("log",)
    dex.testing.replay(closes_then_continues, history)


def test_readers_never_read_the_history(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(progress, 2)
    engine.drain()
    histories: list[str] = []
    for name in ("load_history", "load_history_after", "load_workflow_task"):
        original = getattr(engine.store, name)

        def counted(*args: Any, _original: Any = original, _name: str = name) -> Any:
            histories.append(_name)
            return _original(*args)

        setattr(engine.store, name, counted)
    assert engine.get_published(run_id, "stage") == "streamed"
    assert list(engine.read_stream(run_id, "progress")) == [0, 1]
    assert histories == []


def test_retention_deletes_published_values_and_streams(
    make_engine: Callable[..., dex.Engine], clock: VirtualClock
) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(progress, 2)
    engine.send_event(run_id, "finish")
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    assert engine.store.run_streams(run_id).streams
    clock.advance(timedelta(days=30))
    assert engine.store.delete_finished_runs(clock.now(), 100) == 1
    summary = engine.store.run_streams(run_id)
    assert summary.published == () and summary.streams == ()
    with pytest.raises(dex.RunNotFoundError):
        engine.get_published(run_id, "stage")


def test_unknown_runs_and_bad_keys_are_refused_at_the_call(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    with pytest.raises(dex.RunNotFoundError):
        engine.get_published("no-such-run", "stage", timeout=5)
    with pytest.raises(dex.RunNotFoundError):
        engine.read_stream("no-such-run", "progress", timeout=5)
    with pytest.raises(dex.RunNotFoundError):
        engine.watch_published("no-such-run", "stage", timeout=5)
    run_id = engine.start_workflow(progress, 1)
    for bad in ("", "x" * 257, "a\x00b", "lone \ud800"):
        with pytest.raises(ValueError):
            engine.get_published(run_id, bad)
        with pytest.raises(ValueError):
            engine.read_stream(run_id, bad)
        with pytest.raises(ValueError):
            engine.read_stream_async(run_id, bad)
    with pytest.raises(TypeError):
        engine.read_stream(run_id, 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        engine.get_published(run_id, "stage", timeout=-1)


def test_watch_published_sees_each_new_value_until_the_run_ends(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(progress, 1)
    engine.drain()
    watch = engine.watch_published(run_id, "stage", timeout=10)
    assert next(watch) == "streamed"
    engine.send_event(run_id, "finish")
    assert list(watch) == ["finished"]


def test_the_asyncio_readers(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(ALL, [stream_steps])
    run_id = engine.start_workflow(progress, 3)

    async def read() -> tuple[Any, list[Any]]:
        stage = await engine.get_published_async(run_id, "stage", timeout=10)
        items = [item async for item in engine.read_stream_async(run_id, "progress", timeout=10)]
        return stage, items

    assert asyncio.run(read()) == ("streamed", [0, 1, 2])

    async def unknown() -> list[Any]:
        return [item async for item in engine.read_stream_async("no-such-run", "progress")]

    with pytest.raises(dex.RunNotFoundError):
        asyncio.run(unknown())


def test_a_reader_on_another_engine_reads_while_the_run_goes_on(
    make_engine: Callable[..., dex.Engine],
) -> None:
    worker = make_engine(ALL, [stream_steps], poll_interval=0.01)
    reader = make_engine()  # no code: a client of the same store
    worker.start()
    run_id = worker.start_workflow(streams_and_waits)
    got: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            got.extend(reader.read_stream(run_id, "s", timeout=20))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    deadline = threading.Event()
    for _ in range(400):  # the first item arrives while the run waits for its event
        if got:
            break
        deadline.wait(0.05)
    assert got == ["first"]
    worker.send_event(run_id, "go")
    thread.join(20)
    assert not errors and got == ["first", "second"]
