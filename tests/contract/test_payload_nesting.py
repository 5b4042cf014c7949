"""How deep a payload may nest, and that whatever ``start_workflow`` accepts can be passed on.

The depth ``start_workflow`` accepted used to be whatever Python's recursion limit allowed from
the caller's stack (~330 lists from a test); workflow code, deeper in its own stack, then
failed to send the same value to an activity, and the run failed. Now every payload nests at
most ``MAX_NESTING`` (100) levels, checked by a loop where values are encoded: the deepest
value start accepts goes from the start to workflow code to an activity and back, on both
adapters; one level more is refused at the start, naming the limit. Protobuf messages are
held to what protobuf's parser reads back (it stops at 100 levels), and a remote worker's
JSON result to the same limit as everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2

import dex
from dex.serialization.json_form import json_value, payload_of_json
from dex.serialization.payloads import MAX_NESTING, PayloadConverter

Make = Callable[..., dex.Engine]


def lists(depth: int) -> Any:
    """``depth`` lists inside each other, 7 in the innermost."""
    value: Any = 7
    for _ in range(depth):
        value = [value]
    return value


def dicts(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {f"k{level}": value}
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, (list, dict)) and value:
        value = value[0] if isinstance(value, list) else next(iter(value.values()))
        depth += 1
    return depth


@dex.activity(name="nesting-measure")
def measure(value: Any) -> int:
    return depth_of(value)


@dex.activity(name="nesting-echo")
def echo(value: Any) -> Any:
    return value


@dex.workflow(name="nesting-pass-on")
async def pass_on(ctx: dex.WorkflowContext, value: Any) -> int:
    back = await ctx.activity(echo, value)
    if back != value:  # the activity's result, as deep, came back whole
        raise AssertionError("the value changed on its way")
    return int(await ctx.activity(measure, back))


@dex.activity(name="nesting-measure-message")
def measure_message(message: struct_pb2.Value) -> int:
    depth = 0
    while message.HasField("list_value"):
        message = message.list_value.values[0]
        depth += 1
    return depth


@dex.workflow(name="nesting-pass-on-message")
async def pass_on_message(ctx: dex.WorkflowContext, message: struct_pb2.Value) -> int:
    return int(await ctx.activity(measure_message, message))


def value_lists(depth: int) -> struct_pb2.Value:
    """A protobuf ``Value`` with ``depth`` lists inside each other (two messages a level)."""
    root = struct_pb2.Value()
    current = root
    for _ in range(depth):
        current = current.list_value.values.add()
    current.number_value = 7
    return root


@pytest.mark.parametrize("shape", [lists, dicts], ids=["lists", "dicts"])
def test_the_deepest_value_start_accepts_is_passed_on_to_an_activity(make_engine: Make, shape: Any) -> None:
    engine = make_engine([pass_on], [measure, echo])
    with pytest.raises(dex.SerializationError, match=f"at most {MAX_NESTING} levels deep"):
        engine.start_workflow(pass_on, shape(MAX_NESTING + 1))
    run_id = engine.start_workflow(pass_on, shape(MAX_NESTING))
    engine.drain()
    assert engine.wait(run_id, timeout=10) == MAX_NESTING


def test_a_value_that_contains_itself_is_refused_and_the_next_run_completes(make_engine: Make) -> None:
    engine = make_engine([pass_on], [measure, echo])
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(dex.SerializationError, match="contains itself"):
        engine.start_workflow(pass_on, loop)
    run_id = engine.start_workflow(pass_on, lists(3))
    engine.drain()
    assert engine.wait(run_id, timeout=10) == 3


def test_the_deepest_protobuf_message_start_accepts_is_passed_on(make_engine: Make) -> None:
    engine = make_engine([pass_on_message], [measure_message])
    # 51 lists are 102 messages deep: protobuf's parser would refuse it in the workflow
    with pytest.raises(dex.SerializationError, match="cannot be read back"):
        engine.start_workflow(pass_on_message, value_lists(51))
    run_id = engine.start_workflow(pass_on_message, value_lists(50))
    engine.drain()
    assert engine.wait(run_id, timeout=10) == 50


def test_workflow_code_deep_in_its_own_stack_can_still_send_the_deepest_value(make_engine: Make) -> None:
    """The limit does not depend on the stack of the code that encodes the value."""

    @dex.workflow(name="nesting-deep-stack")
    async def deep_stack(ctx: dex.WorkflowContext, value: Any) -> int:
        async def down(levels: int) -> int:
            if levels == 0:
                return int(await ctx.activity(measure, value))
            return await down(levels - 1)

        return await down(150)

    engine = make_engine([deep_stack], [measure])
    run_id = engine.start_workflow(deep_stack, lists(MAX_NESTING))
    engine.drain()
    assert engine.wait(run_id, timeout=10) == MAX_NESTING


def test_a_remote_workers_json_result_is_held_to_the_same_limit() -> None:
    with pytest.raises(dex.SerializationError, match=f"more than {MAX_NESTING} levels"):
        payload_of_json(lists(MAX_NESTING + 1))
    payload = payload_of_json(lists(MAX_NESTING))
    assert json_value(payload) == lists(MAX_NESTING)
    # and what a remote worker returns, a workflow can send on
    converter = PayloadConverter()
    assert converter.decode(converter.encode(converter.decode(payload))) == lists(MAX_NESTING)
