"""Failure texts from hostile exceptions are recorded, never block anything (docs/reference/contract.md §8).

An activity's exception message with a lone surrogate could not be encoded for PostgreSQL:
its batch of outcomes failed again and again, and no activity result of the process was
written. An exception whose ``__str__`` raises broke the description of the failure: the
pooled path lost the outcome (the run hung), the inline path failed the run though its code
caught ``ActivityFailedError``. Now the texts are stored faithfully or with visible escapes,
and a text that cannot be computed becomes a placeholder; every path, on every adapter.
"""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.app.runtime.options import RuntimeOptions

ONE_ATTEMPT = dex.RetryPolicy(max_attempts=1)
PLACEHOLDER = "<unprintable Unprintable: __str__ raised RuntimeError>"


class Unprintable(Exception):
    """An exception nothing can print: both ``__str__`` and ``__repr__`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def _cycle() -> Exception:
    first, second = ValueError("first"), KeyError("second")
    first.__cause__, second.__cause__ = second, first
    return first


RAISES: dict[str, Any] = {
    "surrogate": lambda: RuntimeError("bad \ud800 text"),
    "nul": lambda: RuntimeError("nul \x00 here"),
    "unprintable": Unprintable,
    "cause cycle": _cycle,
}
EXPECTED = {
    "surrogate": "bad \\ud800 text",  # the six characters of the escape, visible
    "nul": "nul \x00 here",  # stored faithfully: a failure is protobuf bytes, never text
    "unprintable": PLACEHOLDER,
    "cause cycle": "first",
}


@dex.activity(retry=ONE_ATTEMPT)
def hostile(kind: str) -> str:
    raise RAISES[kind]()


@dex.activity
def fine(x: int) -> int:
    return x + 1


@dex.workflow
async def catches(ctx: dex.WorkflowContext, kind: str) -> str:
    try:
        await ctx.activity(hostile, kind)
    except dex.ActivityFailedError as exc:
        return exc.failure.message
    return "no failure"


@dex.workflow
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(fine, x)  # type: ignore[no-any-return]


@dex.workflow
async def raises_itself(ctx: dex.WorkflowContext, kind: str) -> None:
    await ctx.activity(fine, 1)
    raise RAISES[kind]()


WORKFLOWS = [catches, healthy, raises_itself]
ACTIVITIES = [hostile, fine]


@pytest.mark.parametrize("kind", sorted(RAISES))
def test_an_activitys_hostile_failure_reaches_the_workflow(make_engine: Any, kind: str) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(catches, kind)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == EXPECTED[kind]
    (failed,) = [h.event for h in engine.history(run_id) if h.kind == "ActivityTaskFailed"]
    assert failed.failure.message == EXPECTED[kind]
    if kind == "cause cycle":  # the chain is cut where it comes back to itself
        assert failed.failure.cause is not None and failed.failure.cause.type == "KeyError"
        assert failed.failure.cause.cause is None
    healthy_run = engine.start_workflow(healthy, 1)
    engine.drain()
    assert engine.wait(healthy_run, timeout=5) == 2


def test_the_inline_path_records_the_placeholder_too(make_engine: Any) -> None:
    # inline attempts set by hand (as tests/contract/test_inline.py does): deterministic
    engine: dex.Engine = make_engine(
        WORKFLOWS, ACTIVITIES, runtime_options=RuntimeOptions(drain_inline=60.0, slots_ttl=0)
    )
    engine.activity_worker.durations.record("hostile", 0.001)
    claimed: list[Any] = []
    claim = engine.store.claim_activity_tasks

    def counting(*args: Any, **kwargs: Any) -> Any:
        tasks = claim(*args, **kwargs)
        claimed.extend(tasks)
        return tasks

    engine.store.claim_activity_tasks = counting  # type: ignore[method-assign]
    runs = {kind: engine.start_workflow(catches, kind) for kind in RAISES}
    engine.drain()
    for kind, run_id in runs.items():
        assert engine.wait(run_id, timeout=5) == EXPECTED[kind]
    assert claimed == []  # every attempt ran inline, inside its workflow task
    healthy_run = engine.start_workflow(healthy, 1)
    engine.drain()
    assert engine.wait(healthy_run, timeout=5) == 2


@pytest.mark.parametrize("inline_seconds", [0.005, 0], ids=["inline-on", "pooled-only"])
def test_a_started_engine_records_hostile_failures_on_every_path(adapter_factory: Any, inline_seconds: float) -> None:
    # with inline on, the first attempt of an activity in a process takes the pool and the
    # later ones (a few milliseconds each) may run inline; with 0, every attempt is pooled
    engine = dex.Engine(
        adapter_factory(),
        workflows=WORKFLOWS,
        activities=ACTIVITIES,
        poll_interval=0.01,
        inline_activity_seconds=inline_seconds,
    )
    with engine:
        for _round in range(3):
            runs = {kind: engine.start_workflow(catches, kind) for kind in RAISES}
            fine_run = engine.start_workflow(healthy, 1)
            for kind, run_id in runs.items():
                assert engine.wait(run_id, timeout=15) == EXPECTED[kind]
            assert engine.wait(fine_run, timeout=15) == 2


@pytest.mark.parametrize("kind", sorted(RAISES))
def test_workflow_code_raising_a_hostile_exception_fails_only_its_run(make_engine: Any, kind: str) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(raises_itself, kind)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as caught:
        engine.wait(run_id, timeout=5)
    assert caught.value.failure.message == EXPECTED[kind]
    assert caught.value.failure.terminal
    healthy_run = engine.start_workflow(healthy, 1)
    engine.drain()
    assert engine.wait(healthy_run, timeout=5) == 2
