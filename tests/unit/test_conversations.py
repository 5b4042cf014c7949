"""docs/reference/contract.md §14 in the pure core: updates, queries, handlers, published values,
streams, labels, wait_condition, first, step.cancel(), cancellation delivered as
``dex.CancelledError``, terminate and deadlines — each driven through ``decide()`` alone
(``tests/unit/pure_runs.py``), with a cached executor deciding alongside and the history
replayed at the end."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.domain import events as ev
from dex.domain.state import fold
from dex.domain.task import answer_query, deadline_message, terminate
from tests.unit.pure_runs import CONVERTER, T0, PureRun

# -- activities and workflows --------------------------------------------------------------------

CALLS: list[str] = []


@dex.activity(name="conv-charge")
def charge(order: str) -> str:
    CALLS.append(f"charge {order}")
    return f"receipt-{order}"


@dex.activity(name="conv-release")
def release(order: str) -> str:
    CALLS.append(f"release {order}")
    return f"released-{order}"


@dex.activity(name="conv-price")
def price(item: str) -> int:
    return len(item)


ACTIVITIES = (charge, release, price)


@dex.workflow(name="conv-checkout")
async def checkout(ctx: dex.WorkflowContext, order: str) -> dict[str, Any]:
    """The example of docs/reference/contract.md §14, with a priced update."""
    items: list[str] = []

    @ctx.on_update("add-item")
    async def add_item(item: str) -> int:
        items.append(item)
        return len(items)

    @add_item.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_update("price-item")
    async def price_item(item: str) -> int:
        return int(await ctx.activity(price, item))

    @ctx.on_update("fail")
    def fail() -> None:
        raise RuntimeError("the handler gave up")

    @ctx.on_query("items")
    def current() -> list[str]:
        return list(items)

    @ctx.on_query("sneaky")
    def sneaky() -> None:
        ctx.activity(charge, "from a query")

    @ctx.on_query("broken")
    def broken() -> None:
        raise KeyError("no such thing")

    @ctx.on_event("note")
    def note(text: str) -> None:
        items.append(f"note: {text}")

    ctx.publish("stage", "collecting")
    await ctx.wait_condition(lambda: len(items) >= 3, timeout=timedelta(hours=1))
    ctx.publish("stage", "paying")
    for i in range(2):
        await ctx.write_stream("progress", {"step": i})
    ctx.close_stream("progress")
    try:
        return {"receipt": await ctx.activity(charge, order), "items": items}
    except dex.CancelledError:
        await ctx.activity(release, order)
        raise


def checkout_run(**options: Any) -> PureRun:
    run = PureRun(checkout, "o1", activities=ACTIVITIES, cached=True, **options)
    run.settle()
    return run


# -- updates ---------------------------------------------------------------------------------------


def test_an_update_runs_its_handler_and_answers_with_what_it_returned() -> None:
    run = checkout_run()
    run.update("add-item", "lamp", update_id="u1")
    run.step()
    answer = run.answer("u1")
    assert (answer.rejected, answer.failure, run.value(answer.result)) == (False, None, 1)
    assert run.events(ev.UpdateAccepted) == [
        ev.UpdateAccepted(update_id="u1", name="add-item", args=(CONVERTER.encode("lamp"),))
    ]
    assert [e.update_id for e in run.events(ev.UpdateCompleted)] == ["u1"]
    run.replays()


def test_a_validator_that_raises_rejects_the_update_and_nothing_is_recorded() -> None:
    run = checkout_run()
    before = list(run.history)
    run.update("add-item", "", update_id="u1")
    result = run.step()
    answer = run.answer("u1")
    assert answer.rejected and answer.failure is not None
    assert (answer.failure.type, answer.failure.message) == ("ValueError", "an item needs a name")
    assert run.history == before and result.consumed  # consumed, never history
    assert not run.visible


def test_an_unknown_update_name_is_rejected_naming_the_known_ones() -> None:
    run = checkout_run()
    run.update("remove-item", "lamp", update_id="u1")
    run.step()
    answer = run.answer("u1")
    assert answer.rejected and answer.failure is not None
    assert answer.failure.type == "UpdateRejectedError"
    assert "no update handler named 'remove-item'" in answer.failure.message
    assert "'add-item'" in answer.failure.message


def test_a_handler_that_raises_fails_the_update_and_the_run_goes_on() -> None:
    run = checkout_run()
    run.update("fail", update_id="u1")
    run.update("add-item", "lamp", update_id="u2")
    run.step()
    failed = run.answer("u1")
    assert not failed.rejected and failed.failure is not None
    assert (failed.failure.type, failed.failure.message) == ("RuntimeError", "the handler gave up")
    assert run.value(run.answer("u2").result) == 1
    assert not run.ended
    run.replays()


def test_an_async_handler_awaits_a_step_and_is_answered_when_it_finishes() -> None:
    run = checkout_run()
    run.update("price-item", "shade", update_id="u1")
    first = run.step()
    assert first.update_answers == () and len(first.activity_tasks) == 1
    run.settle()
    assert run.value(run.answer("u1").result) == 5
    run.replays()


def test_the_same_update_id_runs_the_handler_once_and_returns_its_recorded_answer_again() -> None:
    run = checkout_run()
    run.update("add-item", "lamp", update_id="u1")
    run.step()
    run.update("add-item", "lamp", update_id="u1")
    again = run.step()
    assert [run.value(a.result) for a in run.answers] == [1, 1]
    assert again.new_events == () and len(run.events(ev.UpdateAccepted)) == 1


def test_an_update_to_an_ended_run_is_refused() -> None:
    run = finished_checkout()
    run.update("add-item", "late", update_id="u9")
    run.step()
    answer = run.answer("u9")
    assert answer.rejected and answer.failure is not None and answer.failure.message == "the run has ended"


def finished_checkout() -> PureRun:
    run = checkout_run()
    for i, item in enumerate(("lamp", "shade", "bulb")):
        run.update("add-item", item, update_id=f"add-{i}")
    run.settle()
    assert run.completion.status is dex.RunStatus.COMPLETED
    return run


# -- queries -----------------------------------------------------------------------------------------


def test_a_query_is_answered_by_replay_and_records_nothing_even_for_an_ended_run() -> None:
    run = checkout_run()
    run.update("add-item", "lamp", update_id="u1")
    run.send_event("note", "fragile")
    run.settle()
    before = list(run.history)
    answer = answer_query(run.definition, run.run_id, run.history, "items", (), CONVERTER)
    assert CONVERTER.decode(answer) == ["note: fragile", "lamp"]
    assert run.history == before
    ended = finished_checkout()
    answer = answer_query(ended.definition, ended.run_id, ended.history, "items", (), CONVERTER)
    assert CONVERTER.decode(answer) == ["lamp", "shade", "bulb"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nothing", "has no query named 'nothing' (known: 'broken', 'items', 'sneaky')"),
        ("sneaky", "query 'sneaky' may not start an activity"),
        ("broken", "query 'broken' failed: KeyError"),
    ],
)
def test_a_query_that_is_unknown_raises_or_starts_a_step_is_a_query_error(name: str, message: str) -> None:
    run = checkout_run()
    with pytest.raises(dex.QueryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        answer_query(run.definition, run.run_id, run.history, name, (), CONVERTER)


@dex.workflow(name="conv-async-query")
async def async_query(ctx: dex.WorkflowContext) -> None:
    @ctx.on_query("q")
    async def q() -> int:
        return 1

    await ctx.sleep(1)


def test_a_query_handler_must_be_sync() -> None:
    run = PureRun(async_query)
    run.step()
    assert run.completion.status is dex.RunStatus.FAILED
    assert "the handler of query 'q' must be a plain (sync) function" in (run.completion.failure or _none()).message


# -- events, published values, streams, labels -----------------------------------------------------


def test_event_handlers_get_every_event_in_arrival_order_also_those_sent_before() -> None:
    run = PureRun(checkout, "o1", activities=ACTIVITIES, cached=True)
    run.send_event("note", "early")  # before the handler is registered
    run.settle()
    run.send_event("note", "one")
    run.send_event("note", "two")
    run.settle()
    assert run.completion.status is dex.RunStatus.COMPLETED
    assert run.value(run.completion.result)["items"] == ["note: early", "note: one", "note: two"]
    run.replays()


def test_published_values_and_streams_are_recorded_and_reported() -> None:
    run = finished_checkout()
    assert run.published == {"stage": "paying"}
    assert run.streams == {"progress": [{"step": 0}, {"step": 1}]}
    assert [e.key for e in run.events(ev.ValuePublished)] == ["stage", "stage"]
    assert run.events(ev.StreamClosed) == [ev.StreamClosed(key="progress")]
    assert fold(run.history).streams == (("progress", 2),)
    run.replays()


@dex.workflow(name="conv-stream-after-close")
async def stream_after_close(ctx: dex.WorkflowContext) -> str:
    ctx.close_stream("log")
    try:
        await ctx.write_stream("log", "late")
    except ValueError as exc:
        return str(exc)
    return "written"


def test_writing_to_a_closed_stream_is_refused_at_the_call() -> None:
    run = PureRun(stream_after_close)
    run.step()
    assert run.value(run.completion.result) == "stream 'log' is closed: nothing more can be written to it"


@dex.workflow(name="conv-labels")
async def relabel(ctx: dex.WorkflowContext) -> dict[str, str]:
    ctx.set_labels({"stage": "one", "team": None})
    ctx.set_labels({"zone": "eu"})
    return dict(ctx.labels)


def test_labels_change_for_the_code_the_history_and_the_store() -> None:
    run = PureRun(relabel, labels=(("team", "a"),), cached=True)
    result = run.step()
    assert run.value(run.completion.result) == {"stage": "one", "zone": "eu"}
    assert result.labels == (("stage", "one"), ("zone", "eu"))
    assert run.events(ev.LabelsChanged) == [
        ev.LabelsChanged(set=(("stage", "one"),), removed=("team",)),
        ev.LabelsChanged(set=(("zone", "eu"),)),
    ]
    run.replays()


# -- wait_condition and first ------------------------------------------------------------------------


def test_wait_condition_is_rechecked_after_handlers_and_times_out() -> None:
    run = checkout_run()
    run.update("add-item", "a", update_id="u1")
    run.send_event("note", "b")
    run.step()
    assert not run.tasks  # two items: still waiting
    run.update("add-item", "c", update_id="u2")
    run.settle()
    assert run.completion.status is dex.RunStatus.COMPLETED

    waiting = checkout_run()
    waiting.advance(timedelta(hours=1))
    waiting.step()
    assert waiting.completion.status is dex.RunStatus.FAILED
    assert (waiting.completion.failure or _none()).type == "WaitTimeoutError"


@dex.workflow(name="conv-first")
async def first_of(ctx: dex.WorkflowContext) -> list[Any]:
    a = ctx.wait_for_event("a")
    b = ctx.wait_for_event("b")
    index, value = await ctx.first(a, b, timeout=timedelta(minutes=5))
    later = await ctx.wait_for_event("b" if index == 0 else "a")  # the loser's id, waited anew
    return [index, value, later]


def test_first_returns_the_winner_and_a_losing_wait_consumes_no_event() -> None:
    run = PureRun(first_of, cached=True)
    run.step()
    run.send_event("a", "A")
    run.send_event("b", "B")  # arrives in the same task as the winner: must not be lost
    run.settle()
    assert run.value(run.completion.result) == [0, "A", "B"]
    run.replays()


def test_first_over_two_buffered_events_gives_the_loser_s_back() -> None:
    run = PureRun(first_of, cached=True)
    run.send_event("b", "B")
    run.send_event("a", "A")
    run.settle()
    assert run.value(run.completion.result) == [0, "A", "B"]
    assert run.results[-1].unread_events == 0


def test_first_times_out() -> None:
    run = PureRun(first_of)
    run.step()
    run.advance(timedelta(minutes=5))
    run.step()
    assert (run.completion.failure or _none()).type == "WaitTimeoutError"


# -- cancelling one step -----------------------------------------------------------------------------


@dex.workflow(name="conv-cancel-steps")
async def cancel_steps(ctx: dex.WorkflowContext) -> list[str]:
    seen = []
    for step in (ctx.activity(charge, "x"), ctx.sleep(60), ctx.wait_for_event("e"), ctx.child(checkout, "kid")):
        assert step.cancel()
        assert not step.cancel()  # done: nothing more to cancel
        try:
            await step
        except dex.CancelledError:
            seen.append(step.label)
    seen.append(await ctx.wait_for_event("e"))  # the cancelled wait consumed nothing
    return seen


def test_step_cancel_drops_activities_and_timers_cancels_children_and_records_each() -> None:
    run = PureRun(cancel_steps, activities=ACTIVITIES, cached=True)
    first = run.step()
    assert first.cancelled_activities == (4,) and first.cancelled_timers == (5,)
    child = first.child_runs[0].run_id
    assert [(m.run_id, type(m.event).__name__) for m in first.messages if m.run_id == child] == [
        (child, "RunCancelled")
    ]
    assert [e.created_seq for e in run.events(ev.CancelRequested)] == [4, 5, 6]
    run.send_event("e", "kept")
    run.settle()
    assert run.value(run.completion.result) == [
        "activity conv-charge",
        "timer",
        "event e",
        "child conv-checkout",
        "kept",
    ]
    run.replays()


# -- cancelling and terminating the run --------------------------------------------------------------


def test_a_cancel_reaches_the_code_at_its_await_and_cleanup_is_recorded_before_the_end() -> None:
    run = finished_checkout_waiting_for_charge()
    run.cancel("changed my mind")
    result = run.step()
    assert result.cancelled_activities  # the charge, pending at the request
    assert [t.name for t in result.activity_tasks] == ["conv-release"]  # cleanup, run live
    run.settle()
    assert run.completion.status is dex.RunStatus.CANCELLED
    kinds = run.kinds()
    assert kinds.index("RunCompleted") > max(i for i, k in enumerate(kinds) if k == "ActivityTaskCompleted")
    assert kinds[-2:] == ["RunCompleted", "WorkflowTaskCompleted"]
    run.replays()


def finished_checkout_waiting_for_charge() -> PureRun:
    run = checkout_run()
    for i, item in enumerate(("lamp", "shade", "bulb")):
        run.update("add-item", item, update_id=f"add-{i}")
    run.step()
    assert [t.name for t in run.tasks.values()] == ["conv-charge"]
    return run


@dex.workflow(name="conv-shrug")
async def shrug(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.sleep(3600)
    except dex.CancelledError as exc:
        return f"ignored {exc.reason}"
    return "slept"


def test_code_that_catches_the_cancel_decides_how_the_run_ends() -> None:
    run = PureRun(shrug, cached=True)
    run.step()
    run.cancel("please")
    result = run.step()
    assert result.cancelled_timers == (4,)
    assert run.completion.status is dex.RunStatus.COMPLETED
    assert run.value(run.completion.result) == "ignored please"


def test_a_cancel_before_the_code_ran_ends_the_run_without_running_it() -> None:
    CALLS.clear()
    run = PureRun(checkout, "o1", activities=ACTIVITIES)
    run.cancel()
    run.settle()
    assert run.completion.status is dex.RunStatus.CANCELLED and not CALLS
    assert run.events(ev.ValuePublished) == []


def test_a_suspended_run_resumes_to_clean_up_when_cancelled() -> None:
    run = finished_checkout_waiting_for_charge()
    run.suspend()
    run.step()
    run.cancel()
    result = run.step()
    assert result.resumed and [t.name for t in result.activity_tasks] == ["conv-release"]
    run.settle()
    assert run.completion.status is dex.RunStatus.CANCELLED


def test_an_update_still_running_when_the_run_ends_is_answered_before_the_terminal_event() -> None:
    run = finished_checkout_waiting_for_charge()
    run.update("price-item", "lamp", update_id="late")
    run.step()
    run.cancel()
    run.settle()
    answer = run.answer("late")  # the step its handler awaited was cancelled with the run
    assert answer.failure is not None and answer.failure.type == "CancelledError"
    completed = [i for i, item in enumerate(run.history) if isinstance(item.event, ev.UpdateCompleted)]
    ended = next(i for i, item in enumerate(run.history) if isinstance(item.event, ev.RunCompleted))
    assert completed and max(completed) < ended
    assert fold(run.history).pending_updates == ()


def test_terminate_needs_no_code_and_the_code_replays_what_it_wrote() -> None:
    run = finished_checkout_waiting_for_charge()
    run.update("price-item", "lamp", update_id="late")
    run.step()
    run.terminate("stuck")
    result = run.step()  # decide(): from the history alone; the cached executor replays it
    assert run.completion.status is dex.RunStatus.TERMINATED
    assert (run.completion.failure or _none()).message == "stuck"
    assert sorted(result.cancelled_activities) == sorted(run.cancelled_activities[-2:])
    assert run.answer("late").failure is not None
    assert fold(run.history).status is dex.RunStatus.TERMINATED
    run.replays()
    # and the pure function, on the history before, says the same
    before = run.history[: -len(result.new_events)]
    again = terminate(run.run_id, before, [], "stuck", run.now)
    assert again.new_events == result.new_events


# -- deadlines and detached runs ---------------------------------------------------------------------


@dex.workflow(name="conv-starter")
async def starter(ctx: dex.WorkflowContext) -> str:
    child = ctx.child(checkout, "kid", timeout=timedelta(minutes=30))
    run_id = ctx.start_workflow(checkout, "other", labels={"by": "starter"}, timeout=60)
    assert child.cancel()
    return run_id


def test_children_and_detached_runs_get_their_deadline_as_a_timed_cancel() -> None:
    run = PureRun(starter, cached=True)
    result = run.step()
    (detached,) = result.detached_runs
    assert run.value(run.completion.result) == detached.run_id
    assert detached.created.parent_run_id is None and detached.created.labels == (("by", "starter"),)
    assert detached.created.deadline == T0 + timedelta(seconds=60)
    (child,) = result.child_runs
    assert child.created.deadline == T0 + timedelta(minutes=30)
    timed = [m for m in result.messages if isinstance(m.event, ev.RunCancelled) and m.event.reason == "timeout"]
    assert {(m.run_id, m.visible_from) for m in timed} == {
        (child.run_id, T0 + timedelta(minutes=30)),
        (detached.run_id, T0 + timedelta(seconds=60)),
    }
    assert deadline_message(detached.run_id, detached.created) in timed
    run.replays()


# -- poison names and keys ---------------------------------------------------------------------------

# a lone surrogate cannot even be a workflow's argument: the code makes the bad value itself
POISON = [("nul", "NUL character"), ("surrogate", "lone surrogate")]
BAD = {"nul": "a\x00b", "surrogate": "a\ud800b", "fine": "fine"}


@dex.workflow(name="conv-poison")
async def poison(ctx: dex.WorkflowContext, where: str, kind: str) -> str:
    bad = BAD[kind]
    calls = {
        "update": lambda: ctx.on_update(bad)(lambda: None),
        "query": lambda: ctx.on_query(bad)(lambda: None),
        "event": lambda: ctx.on_event(bad)(lambda _x: None),
        "publish": lambda: ctx.publish(bad, 1),
        "stream": lambda: ctx.close_stream(bad),
        "label-key": lambda: ctx.set_labels({bad: "v"}),
        "label-value": lambda: ctx.set_labels({"k": bad}),
        "wait": lambda: ctx.wait_for_event(bad),
    }
    try:
        calls[where]()
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize(("kind", "named"), POISON, ids=[p[0] for p in POISON])
@pytest.mark.parametrize("where", ["update", "query", "event", "publish", "stream", "label-key", "label-value", "wait"])
def test_poison_names_and_keys_are_refused_naming_the_problem(where: str, kind: str, named: str) -> None:
    run = PureRun(poison, where, kind)
    run.step()
    assert run.completion.status is dex.RunStatus.COMPLETED
    message = run.value(run.completion.result)
    assert named in message, message
    healthy = PureRun(poison, where, "fine")
    healthy.step()
    assert healthy.value(healthy.completion.result) == "accepted"


def test_a_poison_update_name_from_outside_is_rejected_and_the_run_goes_on() -> None:
    run = checkout_run()
    run.update("add\x00item", "x", update_id="u1")
    run.update("add-item", "lamp", update_id="u2")
    run.step()
    assert run.answer("u1").rejected
    assert run.value(run.answer("u2").result) == 1


# -- histories recorded before cancellation reached the code --------------------------------------


@dex.workflow(name="conv-old-cancel")
async def old_cancel(ctx: dex.WorkflowContext) -> None:
    try:
        await ctx.sleep(3600)
    finally:
        await ctx.activity(release, "x")  # before, closing the coroutine stopped here silently


def test_a_cancel_recorded_the_old_way_still_replays() -> None:
    run = PureRun(old_cancel, activities=ACTIVITIES)
    run.step()
    last = run.history[-1].sequence_number
    old_block = [
        ev.WorkflowTaskStarted(),
        ev.RunCancelled(reason=""),
        ev.RunCompleted(status=dex.RunStatus.CANCELLED),
        ev.WorkflowTaskCompleted(),
    ]
    # what closing the coroutine recorded: the cleanup activity its finally asked for, never run
    old_block.insert(2, run.history[3].event)
    assert isinstance(old_block[2], ev.TimerCreated)
    old_block[2] = ev.ActivityTaskCreated(
        name="conv-release",
        input=(CONVERTER.encode("x"),),
        queue="default",
        priority=0,
        retry_policy=dex.RetryPolicy(),
        lock_timeout=timedelta(minutes=5),
    )
    history = run.history + [
        ev.HistoryEvent(sequence_number=last + 1 + i, timestamp=T0, event=e) for i, e in enumerate(old_block)
    ]
    dex.testing.replay(old_cancel, history, activities=ACTIVITIES)
    # decided today, the same request runs the cleanup live instead
    run.cancel()
    run.step()
    assert [t.name for t in run.tasks.values()] == ["conv-release"]


def _none() -> dex.FailureInfo:
    raise AssertionError("expected a failure")


# -- hostile handlers ----------------------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Escape(BaseException):
    pass


@dex.workflow(name="conv-hostile")
async def hostile(ctx: dex.WorkflowContext) -> str:
    @ctx.on_update("unprintable")
    def unprintable() -> None:
        raise Unprintable()

    @ctx.on_update("escape")
    def escape() -> None:
        raise Escape("out")

    @ctx.on_update("guarded")
    def guarded() -> int:
        return 1

    @guarded.validator
    def _() -> None:
        raise Escape("refused hard")

    @ctx.on_event("boom")
    def boom(_value: object) -> None:
        raise ValueError("the event handler broke")

    return str(await ctx.wait_for_event("done"))


@pytest.mark.parametrize(
    ("name", "rejected", "kind"),
    [("unprintable", False, "Unprintable"), ("escape", False, "Escape"), ("guarded", True, "Escape")],
)
def test_a_handler_or_validator_raising_anything_answers_the_update_and_the_run_goes_on(
    name: str, rejected: bool, kind: str
) -> None:
    run = PureRun(hostile, cached=True)
    run.step()
    run.update(name, update_id="u1")
    run.step()
    answer = run.answer("u1")
    assert answer.rejected is rejected and answer.failure is not None and answer.failure.type == kind
    run.send_event("done", "ok")
    run.step()
    assert run.value(run.completion.result) == "ok"  # a healthy run after it
    run.replays()


def test_an_event_handler_that_raises_fails_the_run_like_the_workflow_raising() -> None:
    run = PureRun(hostile, cached=True)
    run.step()
    run.send_event("boom")
    run.step()
    assert run.completion.status is dex.RunStatus.FAILED
    assert (run.completion.failure or _none()).message == "the event handler broke"


def test_update_requests_from_outside_are_checked_where_they_enter() -> None:
    from dex.domain.handlers import update_request

    assert update_request("u1", "add-item", ()).name == "add-item"
    with pytest.raises(ValueError, match="update name must not contain a NUL character"):
        update_request("u1", "add\x00item", ())
    with pytest.raises(ValueError, match="update id must be valid Unicode text, but it holds a lone surrogate"):
        update_request("u\ud800", "add-item", ())
    run = checkout_run()
    with pytest.raises(ValueError, match="query name must not contain a NUL character"):
        answer_query(run.definition, run.run_id, run.history, "it\x00ems", (), CONVERTER)


@dex.workflow(name="conv-relabel-and-continue")
async def relabel_and_continue(ctx: dex.WorkflowContext, generation: int) -> dict[str, str]:
    if generation == 0:
        ctx.set_labels({"stage": "second"})
        ctx.continue_as_new(1)
    return dict(ctx.labels)


def test_labels_set_by_the_code_carry_over_continue_as_new() -> None:
    run = PureRun(relabel_and_continue, 0, labels=(("team", "a"),))
    result = run.step()
    assert result.new_history is not None and result.labels == (("stage", "second"), ("team", "a"))
    run.step()
    assert run.value(run.completion.result) == {"stage": "second", "team": "a"}


@dex.workflow(name="conv-parent-stuck")
async def parent_stuck(ctx: dex.WorkflowContext) -> None:
    kid = ctx.child(checkout, "kid")
    await ctx.gather(kid, ctx.activity(charge, "p"), ctx.wait_for_event("never"))


def test_terminate_decided_with_or_without_the_code_is_the_same_for_children_activities_and_events() -> None:
    run = PureRun(parent_stuck, activities=ACTIVITIES, cached=True)  # cached: advance() must agree
    first = run.step()
    (kid,) = first.child_runs
    run.send_event("stray", 1)  # never read
    run.step()
    run.terminate("enough")
    result = run.step()
    assert run.completion.status is dex.RunStatus.TERMINATED
    assert [(m.run_id, m.event) for m in result.messages] == [
        (kid.run_id, ev.RunTerminated(reason=f"parent run {run.run_id} was terminated"))
    ]
    assert result.cancelled_activities == (5,) and result.unread_events == 0


@dex.workflow(name="conv-waits-once")
async def waits_once(ctx: dex.WorkflowContext) -> str:
    return str(await ctx.wait_for_event("x"))


def test_a_cancel_in_the_task_that_brings_the_awaited_event_comes_first_and_the_event_stays_unread() -> None:
    run = PureRun(waits_once, cached=True)
    run.step()
    run.send_event("x", "v")
    run.cancel("now")
    result = run.step()
    assert run.completion.status is dex.RunStatus.CANCELLED
    assert (run.completion.failure or _none()).message == "the run was cancelled: now"
    assert result.unread_events == 1


def test_a_cancelling_run_is_not_held_back_by_a_suspend() -> None:
    run = finished_checkout_waiting_for_charge()
    run.cancel()
    run.suspend()
    result = run.step()
    assert result.resumed and [t.name for t in result.activity_tasks] == ["conv-release"]
    assert not fold(run.history).suspended
    run.settle()
    assert run.completion.status is dex.RunStatus.CANCELLED


def test_a_worker_holding_the_run_answers_a_query_from_its_executor_and_records_nothing() -> None:
    run = checkout_run()
    run.update("add-item", "lamp", update_id="u1")
    run.step()
    assert run.cached is not None
    before = list(run.history)
    assert CONVERTER.decode(run.cached.query("items", ())) == ["lamp"]
    with pytest.raises(dex.QueryError, match="may not start an activity"):
        run.cached.query("sneaky", ())
    run.update("add-item", "shade", update_id="u2")
    run.step()  # and the executor decides on exactly as the fresh replay does (PureRun checks)
    assert run.history[: len(before)] == before
    assert CONVERTER.decode(run.cached.query("items", ())) == ["lamp", "shade"]


RAN_AFTER_TERMINATE: list[str] = []


@dex.workflow(name="conv-terminated-quietly")
async def terminated_quietly(ctx: dex.WorkflowContext) -> None:
    try:
        await ctx.sleep(60)
    except dex.CancelledError:
        RAN_AFTER_TERMINATE.append("except")
        raise


def test_no_workflow_code_runs_once_the_run_is_terminated() -> None:
    RAN_AFTER_TERMINATE.clear()
    run = PureRun(terminated_quietly, cached=True)
    run.step()
    run.terminate("stop")
    run.step()
    assert run.completion.status is dex.RunStatus.TERMINATED
    assert RAN_AFTER_TERMINATE == []  # neither the fresh decide nor the cached executor ran it


def test_what_the_caller_of_an_update_gets_for_each_answer() -> None:
    from dex.domain.task import update_result

    run = checkout_run()
    run.update("add-item", "lamp", update_id="ok")
    run.update("add-item", "", update_id="refused")
    run.update("fail", update_id="failed")
    run.step()
    assert CONVERTER.decode(update_result(run.answer("ok"))) == 1
    with pytest.raises(dex.UpdateRejectedError, match="'refused': ValueError: an item needs a name") as refused:
        update_result(run.answer("refused"))
    assert refused.value.failure.type == "ValueError"
    with pytest.raises(dex.UpdateFailedError, match="RuntimeError: the handler gave up") as failed:
        update_result(run.answer("failed"))
    assert failed.value.failure.message == "the handler gave up"
    ended = finished_checkout()
    ended.update("add-item", "late", update_id="late")
    ended.step()
    with pytest.raises(dex.InvalidStateError, match="the run has ended"):
        update_result(ended.answer("late"))
