"""Smaller edges of the API: each mistake gets a clear error at the call.

A run id that is not a str reached PostgreSQL as an int or NULL (a raw psycopg error, and a
flusher traceback for ``send_event``); a ``bytearray`` was called a value "inside a list";
a tuple-keyed dict gave "unhashable type: 'list'"; ``asyncio.gather`` in a workflow said
"no current event loop"; ``wait`` took a negative timeout; ``list_runs`` took naive datetimes.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import dex


@dex.activity
def add_one(x: int) -> int:
    return x + 1


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(add_one, x)  # type: ignore[no-any-return]


@dex.workflow
async def waits(ctx: dex.WorkflowContext) -> Any:
    return await ctx.wait_for_event("go")


def _healthy_run_completes(engine: dex.Engine) -> None:
    run_id = engine.start_workflow(healthy, 41)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 42


RUN_ID_CALLS: dict[str, Callable[[dex.Engine, Any], Any]] = {
    "send_event": lambda e, r: e.send_event(r, "go", 1),
    "cancel": lambda e, r: e.cancel(r),
    "suspend": lambda e, r: e.suspend(r),
    "resume": lambda e, r: e.resume(r),
    "get_run": lambda e, r: e.get_run(r),
    "wait": lambda e, r: e.wait(r, timeout=1),
    "history": lambda e, r: e.history(r),
    "export_history": lambda e, r: e.export_history(r),
}


@pytest.mark.parametrize("bad", [42, None, b"run", "uuid"], ids=["int", "None", "bytes", "UUID"])
@pytest.mark.parametrize("call", sorted(RUN_ID_CALLS))
def test_a_run_id_that_is_not_a_str_is_refused_at_the_call(make_engine: Any, call: str, bad: Any) -> None:
    engine = make_engine([healthy, waits], [add_one])
    waiting = engine.start_workflow(waits)
    run_id = uuid.UUID(waiting) if bad == "uuid" else bad
    with pytest.raises(TypeError, match="run_id must be a str") as caught:
        RUN_ID_CALLS[call](engine, run_id)
    if bad == "uuid":
        assert "str(run_id)" in str(caught.value)
    engine.drain()  # nothing bad was buffered: the flush goes through
    engine.send_event(waiting, "go", "now")
    engine.drain()
    assert engine.wait(waiting, timeout=5) == "now"
    _healthy_run_completes(engine)


@pytest.mark.parametrize("timeout", [-1, -0.5, math.nan, timedelta(seconds=-1), "1", True], ids=repr)
def test_wait_refuses_a_timeout_that_is_not_a_duration(make_engine: Any, timeout: Any) -> None:
    engine = make_engine([healthy], [add_one])
    run_id = engine.start_workflow(healthy, 1)
    with pytest.raises(ValueError, match="timeout"):
        engine.wait(run_id, timeout=timeout)
    with pytest.raises(ValueError, match="timeout"):
        asyncio.run(engine.wait_async(run_id, timeout=timeout))
    engine.drain()
    assert engine.wait(run_id, timeout=0) == 2  # zero is fine: the run has ended
    assert engine.wait(run_id, timeout=math.inf) == 2


@pytest.mark.parametrize("parameter", ["created_after", "created_before"])
def test_list_runs_refuses_naive_datetimes(make_engine: Any, parameter: str) -> None:
    engine = make_engine([healthy], [add_one])
    run_id = engine.start_workflow(healthy, 1)
    with pytest.raises(ValueError, match=f"{parameter} must be timezone-aware"):
        engine.list_runs(**{parameter: datetime(2020, 1, 1)})
    with pytest.raises(TypeError, match=parameter):
        engine.list_runs(**{parameter: "2020-01-01"})
    aware = datetime(2020, 1, 1, tzinfo=UTC)
    later = datetime(2999, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    bound = aware if parameter == "created_after" else later
    assert [r.run_id for r in engine.list_runs(**{parameter: bound})] == [run_id]


@dex.workflow
async def takes_bytes(ctx: dex.WorkflowContext, data: bytes) -> int:
    assert isinstance(data, bytes)
    return len(data)


@dex.workflow
async def takes_anything(ctx: dex.WorkflowContext, value: Any) -> Any:
    return value


def test_a_bytearray_is_sent_as_bytes(make_engine: Any) -> None:
    engine = make_engine([takes_bytes, takes_anything, healthy], [add_one])
    run_id = engine.start_workflow(takes_bytes, bytearray(b"abc"))
    other = engine.start_workflow(takes_anything, bytearray(b"xy"))
    # inside a value, bytes are base64 text; an Any hint leaves them so (a bytes hint restores them)
    inside = engine.start_workflow(takes_anything, {"data": bytearray(b"x")})
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 3
    assert engine.wait(other, timeout=5) == b"xy"
    assert engine.wait(inside, timeout=5) == {"data": "eA=="}


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({(1, 2): "pair"}, "argument 0: value of type dict is not serialisable: its key (1, 2) is of type tuple"),
        ({"orders": {(1, 2): 3}}, "dict at ['orders'] is not serialisable: its key (1, 2) is of type tuple"),
        ([{frozenset(): 1}], "value of type dict at [0] is not serialisable: its key frozenset() is of type frozenset"),
    ],
)
def test_a_dict_with_keys_that_are_not_str_is_refused_saying_where(make_engine: Any, value: Any, where: str) -> None:
    engine = make_engine([takes_anything, waits, healthy], [add_one])
    with pytest.raises(dex.SerializationError) as caught:
        engine.start_workflow(takes_anything, value)
    assert where in str(caught.value)
    assert engine.list_runs() == []
    waiting = engine.start_workflow(waits)
    with pytest.raises(dex.SerializationError, match="only str keys are allowed"):
        engine.send_event(waiting, "go", value)
    engine.drain()
    assert engine.get_run(waiting).status is dex.RunStatus.RUNNING
    _healthy_run_completes(engine)


@dex.workflow
async def uses_asyncio(ctx: dex.WorkflowContext, how: str) -> Any:
    if how == "gather":
        return await asyncio.gather(ctx.activity(add_one, 1), ctx.activity(add_one, 2))
    if how == "create_task":
        step = _one_step(ctx)
        try:
            return await asyncio.create_task(step)
        finally:
            step.close()  # create_task refused it before it started
    if how == "wait_for":
        return await asyncio.wait_for(ctx.activity(add_one, 1), timeout=1)
    raise AssertionError(how)


async def _one_step(ctx: dex.WorkflowContext) -> int:
    return await ctx.activity(add_one, 1)  # type: ignore[no-any-return]


HOW = ["gather", "create_task", "wait_for"]


def _says_what_to_use(failure: dex.FailureInfo) -> None:
    assert failure.type == "TypeError"
    assert "use ctx.gather instead of asyncio.gather" in failure.message
    assert "ctx.wait_for_event(..., timeout=...) instead of asyncio.wait_for" in failure.message


@pytest.mark.parametrize("how", HOW)
def test_asyncio_in_a_workflow_fails_saying_what_to_use(make_engine: Any, how: str) -> None:
    engine = make_engine([uses_asyncio, healthy], [add_one])
    run_id = engine.start_workflow(uses_asyncio, how)
    engine.drain()  # in this (the main) thread asyncio may make a loop; the code awaits its future
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=5)
    _says_what_to_use(caught.value.failure)
    _healthy_run_completes(engine)


def test_asyncio_in_a_workflow_on_a_worker_thread_fails_saying_what_to_use(adapter_factory: Any) -> None:
    # in the workflow worker's thread asyncio finds no event loop at all ("no current event loop")
    engine = dex.Engine(adapter_factory(), workflows=[uses_asyncio, healthy], activities=[add_one], poll_interval=0.01)
    with engine:
        runs = [engine.start_workflow(uses_asyncio, how) for how in HOW]
        fine = engine.start_workflow(healthy, 1)
        for run_id in runs:
            with pytest.raises(dex.WorkflowFailedError) as caught:
                engine.wait(run_id, timeout=15)
            _says_what_to_use(caught.value.failure)
        assert engine.wait(fine, timeout=15) == 2
