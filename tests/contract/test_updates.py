"""``engine.update``, ``engine.query`` and ``ctx.on_event`` end to end, on every adapter
(docs/reference/contract.md §14): each row of the contract's tables for them, on an engine that
drives itself (not started: the calls drain as ``drain(advance_time=False)`` does) and on a
started one (threads, and on PostgreSQL the answer's NOTIFY)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.domain import events as ev

Make = Callable[..., dex.Engine]


@dex.activity(name="upd-shout")
def shout(text: str) -> str:
    return text.upper()


@dex.workflow(name="upd-cart")
async def cart(ctx: dex.WorkflowContext, wanted: int) -> list[str]:
    items: list[str] = []
    notes: list[str] = []
    calls = {"add": 0}

    @ctx.on_update("add")
    async def add(item: str) -> int:
        calls["add"] += 1
        items.append(await ctx.activity(shout, item))
        return len(items)

    @add.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_update("count")
    def count() -> int:
        return calls["add"]

    @ctx.on_update("fail")
    def fail(why: str) -> None:
        raise RuntimeError(why)

    @ctx.on_update("nap")
    async def nap() -> str:
        await ctx.sleep(timedelta(hours=1))
        return "rested"

    @ctx.on_query("items")
    def current() -> list[str]:
        return list(items)

    @ctx.on_query("notes")
    def read_notes() -> list[str]:
        return list(notes)

    @ctx.on_query("sneaky")
    def sneaky() -> None:
        ctx.activity(shout, "from a query")

    @ctx.on_query("broken")
    def broken() -> None:
        raise KeyError("no such thing")

    @ctx.on_event("note")
    def note(text: str) -> None:
        notes.append(text)

    await ctx.wait_condition(lambda: len(items) >= wanted)
    return items


def engine_with_cart(make_engine: Make, **kwargs: Any) -> dex.Engine:
    return make_engine(workflows=[cart], activities=[shout], **kwargs)


def kinds(engine: dex.Engine, run_id: str) -> list[str]:
    return [h.kind for h in engine.history(run_id)]


# -- updates -----------------------------------------------------------------------------------


def test_an_update_returns_what_its_handler_returned_and_is_recorded(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 2)
    assert engine.update(run_id, "add", "lamp") == 1
    assert engine.update(run_id, "add", "desk") == 2
    assert engine.wait(run_id, timeout=10) == ["LAMP", "DESK"]
    recorded = [h.event for h in engine.history(run_id) if isinstance(h.event, ev.UpdateAccepted)]
    assert [e.name for e in recorded] == ["add", "add"]
    assert kinds(engine, run_id).count("UpdateCompleted") == 2


def test_a_validator_that_raises_rejects_the_update_and_records_nothing(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    engine.drain(advance_time=False)
    before = kinds(engine, run_id)
    with pytest.raises(dex.UpdateRejectedError, match="an item needs a name") as caught:
        engine.update(run_id, "add", "")
    assert caught.value.failure.type == "ValueError"
    assert "UpdateAccepted" not in kinds(engine, run_id)
    assert [k for k in kinds(engine, run_id) if k.startswith("Update")] == [k for k in before if k.startswith("Update")]
    assert engine.update(run_id, "add", "lamp") == 1  # the run goes on
    assert engine.wait(run_id, timeout=10) == ["LAMP"]


def test_an_update_of_no_handler_is_rejected(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    with pytest.raises(dex.UpdateRejectedError, match="no update handler named 'remove'"):
        engine.update(run_id, "remove", "lamp")
    assert "UpdateAccepted" not in kinds(engine, run_id)


def test_a_handler_that_raises_fails_the_update_and_the_run_goes_on(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    with pytest.raises(dex.UpdateFailedError, match="out of stock") as caught:
        engine.update(run_id, "fail", "out of stock")
    assert caught.value.failure.type == "RuntimeError"
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    assert engine.update(run_id, "add", "lamp") == 1
    assert engine.wait(run_id, timeout=10) == ["LAMP"]


def test_the_same_update_id_twice_runs_the_handler_once(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 2)
    assert engine.update(run_id, "add", "lamp", update_id="u-1") == 1
    assert engine.update(run_id, "add", "other", update_id="u-1") == 1  # the recorded answer
    assert engine.update(run_id, "count") == 1
    assert engine.query(run_id, "items") == ["LAMP"]
    assert engine.update(run_id, "add", "desk") == 2
    engine.wait(run_id, timeout=10)
    # after the end too: the recorded answer, not InvalidStateError
    assert engine.update(run_id, "add", "again", update_id="u-1") == 1
    assert kinds(engine, run_id).count("UpdateAccepted") == 3


def test_a_rejected_update_id_may_be_tried_again(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    with pytest.raises(dex.UpdateRejectedError):
        engine.update(run_id, "add", "", update_id="retry-me")
    assert engine.update(run_id, "add", "lamp", update_id="retry-me") == 1


def test_an_update_to_an_ended_or_unknown_run_is_refused(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 0)
    engine.wait(run_id, timeout=10) if engine.runtime.threads else engine.drain()
    with pytest.raises(dex.InvalidStateError, match="ended"):
        engine.update(run_id, "add", "lamp")
    with pytest.raises(dex.RunNotFoundError):
        engine.update("no-such-run", "add", "lamp")


def test_an_update_that_arrives_with_the_event_that_ends_the_run_is_refused(make_engine: Make) -> None:
    @dex.workflow(name="upd-gate")
    async def gate(ctx: dex.WorkflowContext) -> str:
        @ctx.on_update("ping")
        def ping() -> str:
            return "pong"

        return str(await ctx.wait_for_event("go"))

    engine = make_engine(workflows=[gate])
    run_id = engine.start_workflow(gate)
    engine.drain(advance_time=False)
    engine.send_event(run_id, "go", "done")  # not yet applied: the update's task takes both
    with pytest.raises(dex.InvalidStateError, match="ended"):
        engine.update(run_id, "ping", timeout=10)
    assert engine.wait(run_id, timeout=10) == "done"


def test_an_update_times_out_and_its_answer_is_kept_for_its_id(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    # the handler sleeps an hour of virtual time: without advancing the clock it cannot answer
    with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
        engine.update(run_id, "nap", update_id="nap-1", timeout=0.2)
    engine.drain()  # the clock jumps: the handler finishes
    assert engine.update(run_id, "nap", update_id="nap-1", timeout=5) == "rested"


def test_update_refuses_bad_timeouts_and_ids_before_writing(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    with pytest.raises(ValueError, match="timeout"):
        engine.update(run_id, "add", "lamp", timeout=-1)
    with pytest.raises(ValueError, match="update id"):
        engine.update(run_id, "add", "lamp", update_id="")
    engine.drain(advance_time=False)
    assert "UpdateAccepted" not in kinds(engine, run_id)


def test_updates_on_a_started_engine(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine, poll_interval=0.5)
    with engine:
        run_id = engine.start_workflow(cart, 3)
        assert engine.update(run_id, "add", "lamp", timeout=20) == 1
        with pytest.raises(dex.UpdateRejectedError):
            engine.update(run_id, "add", "", timeout=20)
        assert engine.query(run_id, "items") == ["LAMP"]
        assert engine.update(run_id, "add", "desk", update_id="d", timeout=20) == 2
        assert engine.update(run_id, "add", "desk", update_id="d", timeout=20) == 2
        assert engine.update(run_id, "add", "chair", timeout=20) == 3
        assert engine.wait(run_id, timeout=20) == ["LAMP", "DESK", "CHAIR"]
        with pytest.raises(dex.InvalidStateError):
            engine.update(run_id, "add", "more", timeout=20)


def test_update_and_query_async(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)

    async def main() -> tuple[Any, Any]:
        answer = await engine.update_async(run_id, "add", "lamp", timeout=10)
        return answer, await engine.query_async(run_id, "items")

    assert asyncio.run(main()) == (1, ["LAMP"])


# -- queries -----------------------------------------------------------------------------------


def test_a_query_reads_the_runs_state_and_records_nothing(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 2)
    assert engine.query(run_id, "items") == []  # a run just started: the call drove it to its handlers
    engine.update(run_id, "add", "lamp")
    before = engine.history(run_id)
    assert engine.query(run_id, "items") == ["LAMP"]
    assert engine.history(run_id) == before


def test_a_query_before_any_worker_ran_the_run_is_answered_from_its_code(make_engine: Make) -> None:
    """A started engine does not drive the run itself: asked before any worker took the run's
    first task (its queue paused), the query runs the code up to its first step, where the
    handlers its top registers answer; only a name the code never registers is unknown."""
    engine = engine_with_cart(make_engine)
    engine.pause_queue("default", "workflow")
    engine.start()
    run_id = engine.start_workflow(cart, 1)
    assert engine.query(run_id, "items") == []
    assert engine.query(run_id, "notes") == []
    with pytest.raises(dex.QueryError, match="no query named 'missing'"):
        engine.query(run_id, "missing")
    assert kinds(engine, run_id) == ["RunCreated"]  # nothing was recorded, nothing ran
    engine.resume_queue("default", "workflow")
    assert engine.update(run_id, "add", "lamp", timeout=10) == 1
    assert engine.wait(run_id, timeout=10) == ["LAMP"]


drawn: list[int] = []


@dex.workflow(name="upd-draws-first")
async def draws_first(ctx: dex.WorkflowContext) -> int:
    state = {"patched": ctx.patched("p1")}

    @ctx.on_query("state")
    def read_state() -> dict[str, Any]:
        return dict(state)

    state["token"] = ctx.side_effect("token", lambda: drawn.append(1) or len(drawn))
    await ctx.wait_for_event("go")
    return int(state["token"])


def test_a_query_before_the_first_task_does_none_of_the_runs_work(make_engine: Make) -> None:
    """The code run for such a query takes its patches as the first task will, and stops at a
    side effect: its function is the run's work, done once, by the run's task."""
    drawn.clear()
    engine = make_engine(workflows=[draws_first])
    engine.pause_queue("default", "workflow")
    engine.start()
    run_id = engine.start_workflow(draws_first)
    assert engine.query(run_id, "state") == {"patched": True}
    assert drawn == [] and kinds(engine, run_id) == ["RunCreated"]
    engine.resume_queue("default", "workflow")
    engine.send_event(run_id, "go")
    assert engine.wait(run_id, timeout=10) == 1
    assert drawn == [1]


def test_a_query_is_answered_by_replay_where_no_worker_holds_the_run(
    make_engine: Make, adapter_factory: Callable[[], Any]
) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 2)
    engine.update(run_id, "add", "lamp")
    elsewhere = dex.Engine(adapter_factory(), workflows=[cart], activities=[shout])  # holds no executor
    assert elsewhere.query(run_id, "items") == ["LAMP"]


def test_an_ended_run_answers_queries(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    engine.update(run_id, "add", "lamp")
    engine.wait(run_id, timeout=10)
    assert engine.query(run_id, "items") == ["LAMP"]


def test_queries_that_cannot_answer_raise_query_error(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    with pytest.raises(dex.QueryError, match="no query named 'missing'"):
        engine.query(run_id, "missing")
    with pytest.raises(dex.QueryError, match="KeyError"):
        engine.query(run_id, "broken")
    with pytest.raises(dex.QueryError, match="only reads"):
        engine.query(run_id, "sneaky")
    with pytest.raises(dex.RunNotFoundError):
        engine.query("no-such-run", "items")
    assert "ActivityTaskCreated" not in kinds(engine, run_id)
    assert engine.update(run_id, "add", "lamp") == 1  # the run is untouched
    assert engine.wait(run_id, timeout=10) == ["LAMP"]


def test_a_query_of_a_workflow_this_engine_does_not_register(
    make_engine: Make, adapter_factory: Callable[[], Any]
) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    engine.drain(advance_time=False)
    stranger = dex.Engine(adapter_factory())
    with pytest.raises(dex.QueryError, match="does not register"):
        stranger.query(run_id, "items")


# -- event handlers ----------------------------------------------------------------------------


def test_events_go_to_their_handler_in_arrival_order(make_engine: Make) -> None:
    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    for text in ("first", "second", "third"):
        engine.send_event(run_id, "note", text)
    engine.drain(advance_time=False)
    assert engine.query(run_id, "notes") == ["first", "second", "third"]
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING


@dex.workflow(name="upd-notes-at-once")
async def notes_at_once(ctx: dex.WorkflowContext) -> list[str]:
    """Registers an event handler and returns at once: no await in between."""
    notes: list[str] = []

    @ctx.on_event("note")
    def note(text: str) -> None:
        notes.append(text)

    return notes


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


@dex.workflow(name="upd-hostile-note")
async def hostile_note(ctx: dex.WorkflowContext) -> str:
    @ctx.on_event("note")
    def note(text: str) -> None:
        raise _Unprintable()

    await ctx.wait_for_event("never")
    return "unreachable"


def test_events_that_came_before_the_handler_reach_it_before_the_code_goes_on(make_engine: Make) -> None:
    """Events sent before the run's first task are handed to the handler as it is registered:
    code that returns right after registering it has seen them (none is lost or left unread)."""
    engine = make_engine(workflows=[notes_at_once, cart], activities=[shout])
    run_id = engine.start_workflow(notes_at_once)
    engine.send_event(run_id, "note", "early")
    engine.send_event(run_id, "note", "earlier still")
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=10) == ["early", "earlier still"]
    assert engine.get_run(run_id).unread_events == 0
    healthy = engine.start_workflow(cart, 1)
    engine.drain(advance_time=False)
    assert engine.update(healthy, "add", "lamp") == 1
    assert engine.wait(healthy, timeout=10) == ["LAMP"]


def test_a_handler_that_raises_for_an_early_event_fails_only_its_run(make_engine: Make) -> None:
    engine = make_engine(workflows=[hostile_note, notes_at_once], activities=[])
    run_id = engine.start_workflow(hostile_note)
    engine.send_event(run_id, "note", "boom")
    engine.drain(advance_time=False)
    run = engine.get_run(run_id)
    assert run.status is dex.RunStatus.FAILED
    assert run.failure is not None and run.failure.type == "_Unprintable"
    healthy = engine.start_workflow(notes_at_once)
    engine.send_event(healthy, "note", "fine")
    engine.drain(advance_time=False)
    assert engine.wait(healthy, timeout=10) == ["fine"]


# -- the port: a request that claims its run's workflow task in the same transaction -----------


def test_a_request_claims_its_runs_workflow_task_with_its_input(make_engine: Make) -> None:
    from dex.app.ports.store import Claim
    from dex.domain.handlers import update_request

    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    engine.drain(advance_time=False)  # the run waits, its handlers registered
    store, now = engine.store, engine.store.clock.now()
    last = engine.history(run_id)[-1].sequence_number
    claim = Claim(names=frozenset({"upd-cart"}), owner="node-x", limit=5, after_seqs={run_id: last})
    request = update_request("u-claimed", "count", ())
    answer, claimed, loaded = store.request_update_then_claim(run_id, request, now, claim)
    assert answer is None
    assert [task.run_id for task in claimed] == [run_id] and claimed[0].lease.owner == "node-x"
    (given,) = loaded
    assert not isinstance(given, Exception)
    assert [e.sequence_number for e in given.events] == [last]  # from where the claim's executor stands
    assert [m.event for m in given.inbox] == [request]
    # the task is the claimer's: the scheduler makes no second one, and another claim finds none
    store.schedule_workflow_tasks(now, 10)
    assert store.claim_workflow_tasks(["upd-cart"], "node-y", now, claim.lease, 5) == []


def test_a_request_with_an_answer_claims_nothing(make_engine: Make) -> None:
    from dex.app.ports.store import Claim
    from dex.domain.handlers import update_request

    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 1)
    assert engine.update(run_id, "count", update_id="u-known") == 0
    claim = Claim(names=frozenset({"upd-cart"}), owner="node-x", limit=5)
    request = update_request("u-known", "count", ())
    answer, claimed, loaded = engine.store.request_update_then_claim(run_id, request, engine.store.clock.now(), claim)
    assert answer is not None and answer.failure is None
    assert (claimed, loaded) == ([], [])


def test_one_update_id_requested_twice_in_one_task_is_answered_once_and_blocks_no_write(make_engine: Make) -> None:
    """Two requests of one id waiting for the same task (a client retrying before the first was
    taken) make two answers of that id in one result: the store keeps one, and its write — with
    every other result flushed beside it — goes through (on PostgreSQL the answers' upsert may
    touch a row only once per statement)."""
    from dex.domain.handlers import update_request

    engine = engine_with_cart(make_engine)
    run_id = engine.start_workflow(cart, 3)
    other = engine.start_workflow(cart, 1)
    engine.drain(advance_time=False)  # both runs wait, their handlers registered
    store, now = engine.store, engine.store.clock.now()
    for _ in range(2):
        assert (
            store.request_update(run_id, update_request("twice", "add", (engine.converter.encode("cup"),)), now) is None
        )
    assert store.request_update(run_id, update_request("refused", "add", (engine.converter.encode(""),)), now) is None
    assert store.request_update(run_id, update_request("refused", "add", (engine.converter.encode(""),)), now) is None
    engine.drain(advance_time=False)
    assert engine.update(run_id, "add", "ignored", update_id="twice") == 1  # the recorded answer
    assert engine.query(run_id, "items") == ["CUP"]
    assert kinds(engine, run_id).count("UpdateAccepted") == 1
    with pytest.raises(dex.UpdateRejectedError):
        engine.update(run_id, "add", "", update_id="refused")
    # the other run's writes were not held up: it still answers and ends
    assert engine.update(other, "add", "pen") == 1
    assert engine.wait(other, timeout=10) == ["PEN"]
