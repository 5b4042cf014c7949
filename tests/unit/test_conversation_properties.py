"""Replay properties of workflows that use handlers and ``first()`` (docs/reference/contract.md §14).

One workflow, :func:`talker`, registers an update handler (with a validator), an event handler
and queries, then runs a random *program* (activities, ``first`` over two event waits, plain
waits, ``wait_condition``, published values, stream items, a step it cancels); hypothesis also
draws what the outside does meanwhile (updates, some with a repeated id, events, time passing,
activities finishing, a cancel). Every recorded history must:

1. be decided alike by a fresh replay and by a long-lived cached executor, task after task
   (``PureRun(cached=True)`` checks each result), and replay at the end;
2. fold without breaking an invariant: nothing after the terminal event, every accepted update
   answered at most once — and exactly once when the run has ended;
3. lose no event: every event the run recorded for its waits was either received by the code or
   is counted as unread when the run ends (a losing wait of ``first`` consumes none);
4. answer every update request the run took, and accept each update id once.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import dex
from dex.domain import events as ev
from dex.domain.state import fold
from dex.domain.task import answer_query
from tests.unit.pure_runs import CONVERTER, PureRun


@dex.activity(name="prop-echo")
def echo(x: Any) -> Any:
    return x


@dex.workflow(name="prop-talker")
async def talker(ctx: dex.WorkflowContext, program: dict[str, Any]) -> dict[str, Any]:
    items: list[str] = []
    received: list[Any] = []
    results: list[Any] = []

    @ctx.on_update("add")
    async def add(item: str, _update_id: str) -> int:
        items.append(item)
        if program["update_awaits"]:
            await ctx.activity(echo, item)
        return len(items)

    @add.validator
    def _(item: str, _update_id: str) -> None:
        if item.startswith("x"):
            raise ValueError("no x items")

    @ctx.on_event("note")
    def note_(text: str) -> None:
        items.append(f"note:{text}")

    @ctx.on_query("received")
    def got() -> list[Any]:
        return list(received)

    @ctx.on_query("notes")
    def notes() -> int:
        return sum(item.startswith("note:") for item in items)

    try:
        for index, step in enumerate(program["steps"]):
            results.append(await run_step(ctx, index, step, items, received))
    except dex.CancelledError:
        await ctx.activity(echo, "cleanup")
        raise
    return {"items": items, "received": received, "results": results}


async def run_step(
    ctx: dex.WorkflowContext, index: int, step: dict[str, Any], items: list[str], received: list[Any]
) -> Any:
    op = step["op"]
    if op == "act":
        return await ctx.activity(echo, index)
    if op == "first":
        try:
            winner, value = await ctx.first(
                ctx.wait_for_event("a"), ctx.wait_for_event("b"), timeout=step["timeout"] or None
            )
        except dex.WaitTimeoutError:
            return "timeout"
        received.append(value)
        return winner
    if op == "wait":
        try:
            value = await ctx.wait_for_event(step["id"], timeout=60)
        except dex.WaitTimeoutError:
            return "timeout"
        received.append(value)
        return value
    if op == "cond":
        try:
            await ctx.wait_condition(lambda: len(items) >= step["n"], timeout=120)
        except dex.WaitTimeoutError:
            return "timeout"
        return len(items)
    if op == "publish":
        ctx.publish("stage", index)
        return None
    if op == "stream":
        await ctx.write_stream("progress", index)
        return None
    if op == "cancel":
        doomed = ctx.activity(echo, "never")
        doomed.cancel()
        try:
            await doomed
        except dex.CancelledError:
            return "cancelled"
    raise AssertionError(step)


steps = st.one_of(
    st.just({"op": "act"}),
    st.builds(lambda t: {"op": "first", "timeout": t}, st.sampled_from([0, 30, 300])),
    st.builds(lambda i: {"op": "wait", "id": i}, st.sampled_from(["a", "b"])),
    st.builds(lambda n: {"op": "cond", "n": n}, st.integers(0, 4)),
    st.just({"op": "publish"}),
    st.just({"op": "stream"}),
    st.just({"op": "cancel"}),
)
programs = st.fixed_dictionaries({"steps": st.lists(steps, min_size=1, max_size=6), "update_awaits": st.booleans()})
actions = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.sampled_from(["p", "q", "x"]), st.sampled_from(["u1", "u2", "u3", "u4"])),
        st.tuples(st.just("event"), st.sampled_from(["a", "b", "note"]), st.sampled_from(["0", "1", "2"])),
        st.tuples(st.just("activities")),
        st.tuples(st.just("time"), st.sampled_from([10, 45, 100])),
        st.tuples(st.just("step")),
        st.tuples(st.just("step")),
        st.tuples(st.just("cancel")),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs, actions)
# both waits of a first() answered in one task: the loser's event must stay readable
@example(
    {"steps": [{"op": "first", "timeout": 0}], "update_awaits": False},
    [("event", "a", "0"), ("event", "b", "1"), ("step",)],
)
# a first() won by an event and a cancel in one task: the event goes back, counted unread
@example(
    {"steps": [{"op": "first", "timeout": 0}], "update_awaits": False},
    [("step",), ("event", "a", "0"), ("cancel",)],
)
# one update id twice in one task: accepted once
@example(
    {"steps": [{"op": "cond", "n": 2}], "update_awaits": True},
    [("update", "p", "u1"), ("update", "p", "u1"), ("step",), ("activities",), ("step",)],
)
def test_handlers_and_first_replay_deterministically_and_lose_nothing(
    program: dict[str, Any], plan: list[tuple[Any, ...]]
) -> None:
    run = PureRun(talker, program, activities=(echo,), cached=True)
    requests: Counter[str] = Counter()
    for action in plan:
        if run.ended:
            break
        match action:
            case ("update", item, update_id):
                run.update("add", item, update_id, update_id=update_id)
                requests[update_id] += 1
            case ("event", event_id, value):
                run.send_event(event_id, value)
            case ("activities",):
                run.run_activities()
            case ("time", seconds):
                run.advance(timedelta(seconds=seconds))
            case ("cancel",):
                run.cancel("drawn")
            case ("step",) if run.visible:
                run.step()  # what arrived since the last step comes in one task
    for round_ in range(40):  # let it end: activities finish, time passes every timeout
        if run.ended:
            break
        if round_ == 3:
            run.cancel("the end")  # a wait without a timeout waits for ever
        run.settle()
        run.advance(timedelta(seconds=400))
    note(f"kinds: {run.kinds()}")
    assert run.ended, "the run should end once everything is answered and every timeout passed"

    # 1. replay
    run.replays()
    # 2. the fold's invariants, and every accepted update answered exactly once
    state = fold(run.history)
    assert state.status is run.completion.status
    assert state.pending_updates == ()
    accepted = [e.update_id for e in run.events(ev.UpdateAccepted)]
    assert len(accepted) == len(set(accepted))
    assert sorted(e.update_id for e in run.events(ev.UpdateCompleted)) == sorted(accepted)
    # 3. no event lost: received by the code, or unread when the run ended
    recorded = run.events(ev.ExternalEventReceived)
    try:
        received = CONVERTER.decode(answer_query(run.definition, run.run_id, run.history, "received", (), CONVERTER))
        notes = CONVERTER.decode(answer_query(run.definition, run.run_id, run.history, "notes", (), CONVERTER))
    except dex.QueryError:
        received, notes = [], 0  # cancelled before its code ran: it never registered a handler
        assert not run.events(ev.ActivityTaskCreated)
    assert len(recorded) == len(received) + notes + run.results[-1].unread_events, (recorded, received, notes)
    # 4. each request the run took before it ended is answered (its handler ran once: accepted once)
    answered = {a.update_id for a in run.answers}
    for update_id in requests:
        sent_before_end = any(
            isinstance(r.event, ev.UpdateAccepted) and r.event.update_id == update_id for r in run.history
        ) or any(a.update_id == update_id for a in run.answers)
        if sent_before_end:
            assert update_id in answered
