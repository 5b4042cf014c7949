"""Failure texts are bounded, the cut visible (docs/reference/bad-input.md).

Payloads stop at 2 MiB, but an exception's message had no bound: a 50 MB message made a 100 MB
history and run page (the message, and the stack trace that repeats it). Every ``FailureInfo``
now keeps at most ``MAX_FAILURE_TEXT`` characters of each text: the start and the end, with a
note between saying how long the text was. On every adapter; the remote workers' ``fail`` is in
``tests/remote/test_failure_bounds.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.domain.values import FAILURE_TEXT_HEAD, FAILURE_TEXT_TAIL, MAX_FAILURE_TEXT, FailureInfo

FIFTY_MB = 50 * 1024 * 1024  # characters
NOTE = "[truncated: 52,428,800 characters, kept the first 32,768 and last 4,096]"


def huge_message() -> str:
    return "START" + "x" * (FIFTY_MB - 8) + "END"


@dex.activity(retry=dex.RetryPolicy(max_attempts=1))
def shouts() -> None:
    raise RuntimeError(huge_message())


@dex.activity
def fine(x: int) -> int:
    return x + 1


@dex.workflow
async def catches(ctx: dex.WorkflowContext) -> int:
    try:
        await ctx.activity(shouts)
    except dex.ActivityFailedError as exc:
        return len(exc.failure.message)
    return -1


@dex.workflow
async def raises_itself(ctx: dex.WorkflowContext) -> None:
    raise ValueError(huge_message())


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(fine, x)  # type: ignore[no-any-return]


WORKFLOWS = [catches, raises_itself, healthy]
ACTIVITIES = [shouts, fine]


def assert_bounded(failure: FailureInfo) -> None:
    """The failure's texts are cut, keeping both ends and saying so."""
    assert len(failure.message) <= MAX_FAILURE_TEXT
    assert failure.message.startswith("START")
    assert failure.message.endswith("END")
    assert NOTE in failure.message
    assert len(failure.stack_trace) <= MAX_FAILURE_TEXT
    assert "[truncated: " in failure.stack_trace  # it repeats the message: cut as well
    assert failure.stack_trace.endswith("END\n")  # its last line, the message's end, is kept


def test_a_50_mb_message_from_an_activity_is_stored_truncated(make_engine: Any) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(catches)
    engine.drain()
    assert engine.wait(run_id, timeout=30) <= MAX_FAILURE_TEXT  # what the workflow code saw
    (failed,) = [h.event for h in engine.history(run_id) if h.kind == "ActivityTaskFailed"]
    assert_bounded(failed.failure)
    assert len(engine.export_history(run_id)) < 4 * MAX_FAILURE_TEXT  # not 100 MB
    healthy_run = engine.start_workflow(healthy, 1)
    engine.drain()
    assert engine.wait(healthy_run, timeout=5) == 2


def test_a_50_mb_message_from_workflow_code_is_stored_truncated(make_engine: Any) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(raises_itself)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=30)
    assert_bounded(caught.value.failure)
    stored = engine.get_run(run_id).failure
    assert stored is not None
    assert_bounded(stored)
    assert len(engine.export_history(run_id)) < 4 * MAX_FAILURE_TEXT
    healthy_run = engine.start_workflow(healthy, 1)
    engine.drain()
    assert engine.wait(healthy_run, timeout=5) == 2


def test_the_bound_keeps_the_ends_and_is_kept_when_read_back() -> None:
    text = "a" * FAILURE_TEXT_HEAD + "b" * 100_000 + "c" * FAILURE_TEXT_TAIL
    failure = FailureInfo(type="T" * 50_000, message=text, stack_trace="short")
    head, _, tail = failure.message.partition(" [truncated: ")
    assert head == "a" * FAILURE_TEXT_HEAD + "\n…"
    assert tail.endswith("c" * FAILURE_TEXT_TAIL) and "b" not in tail.split("\n", 1)[1]
    assert "136,864 characters" in failure.message
    assert len(failure.type) <= MAX_FAILURE_TEXT and failure.stack_trace == "short"
    # a failure made again from its bounded texts (as the store's reads make it) is unchanged
    again = FailureInfo(type=failure.type, message=failure.message, stack_trace=failure.stack_trace)
    assert again == failure
    # the escapes of lone surrogates count too: a text that grows past the bound is cut
    surrogates = FailureInfo(type="T", message="\ud800" * 10_000)
    assert len(surrogates.message) <= MAX_FAILURE_TEXT and "[truncated: 60,000 characters" in surrogates.message
    assert FailureInfo(type="T", message=surrogates.message) == surrogates
    # a text at the bound is kept whole
    assert FailureInfo(type="T", message="m" * MAX_FAILURE_TEXT).message == "m" * MAX_FAILURE_TEXT
