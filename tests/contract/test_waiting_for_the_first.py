"""``ctx.wait_condition`` and ``ctx.first`` through an engine, on every adapter
(docs/reference/contract.md §14): the rows the pure core decides (tests/unit/test_conversations.py)
carried out by the stores — a condition met by an event handler, its timeout, the first of an
activity, a timer and an event wait, a losing event wait that consumes nothing, a step that
loses and is cancelled — each followed by a healthy run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex
from dex.testing import VirtualClock

seen: list[str] = []


@dex.activity(name="wf1-quick")
def quick(text: str) -> str:
    seen.append(text)
    return text.upper()


@dex.workflow(name="wf1-gate")
async def gate(ctx: dex.WorkflowContext, wanted: int) -> list[str]:
    notes: list[str] = []

    @ctx.on_event("note")
    def note(text: str) -> None:
        notes.append(text)

    await ctx.wait_condition(lambda: len(notes) >= wanted, timeout=timedelta(hours=1))
    return notes


@dex.workflow(name="wf1-gate-timeout")
async def gate_timeout(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_condition(lambda: False, timeout=timedelta(minutes=5))
    except dex.WaitTimeoutError:
        return "timed out"
    return "met"


@dex.workflow(name="wf1-race")
async def race(ctx: dex.WorkflowContext) -> list[Any]:
    approval = ctx.wait_for_event("approve")
    timer = ctx.sleep(timedelta(hours=1))
    index, value = await ctx.first(approval, timer)
    if index == 1:
        return ["timer"]
    timer.cancel()
    return ["event", value]


@dex.workflow(name="wf1-loser-keeps-its-event")
async def loser(ctx: dex.WorkflowContext) -> list[Any]:
    late = ctx.wait_for_event("late")
    index, value = await ctx.first(ctx.activity(quick, "a"), late)
    # the event wait lost: it consumed nothing, and is awaited now for the event sent later
    after = await late
    return [index, value, after]


def test_a_condition_met_by_event_handlers_returns_and_the_run_completes(make_engine: Any) -> None:
    engine: dex.Engine = make_engine([gate])
    run_id = engine.start_workflow(gate, 2)
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.send_event(run_id, "note", "one")
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING  # one note: not yet
    engine.send_event(run_id, "note", "two")
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == ["one", "two"]


def test_a_condition_never_met_raises_its_timeout_at_the_await(make_engine: Any, clock: VirtualClock) -> None:
    engine: dex.Engine = make_engine([gate_timeout, gate])
    run_id = engine.start_workflow(gate_timeout)
    engine.drain(advance_time=False)
    clock.advance(timedelta(minutes=6))
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == "timed out"
    healthy = engine.start_workflow(gate, 1)
    engine.send_event(healthy, "note", "ok")
    engine.drain(advance_time=False)
    assert engine.wait(healthy, timeout=5) == ["ok"]


def test_the_first_of_an_event_and_a_timer_wins_and_the_loser_is_cancelled(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine: dex.Engine = make_engine([race])
    by_event = engine.start_workflow(race)
    engine.drain(advance_time=False)
    engine.send_event(by_event, "approve", {"by": "ada"})
    engine.drain(advance_time=False)
    assert engine.wait(by_event, timeout=5) == ["event", {"by": "ada"}]
    kinds = [event.kind for event in engine.history(by_event)]
    assert "CancelRequested" in kinds  # the timer that lost was cancelled, and recorded so
    by_timer = engine.start_workflow(race)
    engine.drain(advance_time=False)
    clock.advance(timedelta(hours=2))
    engine.drain(advance_time=False)
    assert engine.wait(by_timer, timeout=5) == ["timer"]


def test_a_losing_event_wait_consumes_nothing_and_is_awaited_later(make_engine: Any) -> None:
    seen.clear()
    engine: dex.Engine = make_engine([loser], [quick])
    run_id = engine.start_workflow(loser)
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING  # the activity won; `late` waits on
    engine.send_event(run_id, "late", 7)
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == [0, "A", 7]
    assert engine.get_run(run_id).unread_events == 0
    assert seen == ["a"]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@dex.workflow(name="wf1-hostile-condition")
async def hostile_condition(ctx: dex.WorkflowContext) -> str:
    def predicate() -> bool:
        raise _Unprintable()

    await ctx.wait_condition(predicate)
    return "unreachable"


def test_a_predicate_that_raises_an_unprintable_exception_fails_its_run_alone(make_engine: Any) -> None:
    engine: dex.Engine = make_engine([hostile_condition, gate])
    run_id = engine.start_workflow(hostile_condition)
    engine.drain(advance_time=False)
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "_Unprintable"
    healthy = engine.start_workflow(gate, 1)
    engine.send_event(healthy, "note", "still fine")
    engine.drain(advance_time=False)
    assert engine.wait(healthy, timeout=5) == ["still fine"]
