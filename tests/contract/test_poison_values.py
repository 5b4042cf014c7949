"""A NUL or a lone surrogate is refused where it enters (docs/reference/contract.md §8), on every adapter.

PostgreSQL cannot store either in a text column (nor ``\\u0000`` in jsonb), and the client
cannot encode a lone surrogate at all: such a value that reached a batch of writes failed the
batch again and again, and every workflow of the process stalled with it. Each test here
feeds one poisoned field and checks both sides: the call raises a ValueError naming the
field and nothing was stored, and a healthy run started afterwards completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import RunFilter
from dex.domain import events as ev
from dex.domain.values import Payload

POISONS = {"nul": "order\x00A", "surrogate": "order\ud800A"}


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


# -- at the engine's calls ----------------------------------------------------------------------
START_FIELDS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "instance_id": ("instance_id", lambda p: {"instance_id": p}),
    "concurrency_key": ("concurrency_key", lambda p: {"concurrency_key": p}),
    "label key": ("labels key", lambda p: {"labels": {p: "v"}}),
    "label value": ("labels['k'] value", lambda p: {"labels": {"k": p}}),
    "queue": ("queue name", lambda p: {"queue": p}),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_start_workflow_refuses_a_poisoned_workflow_name(make_engine: Any, poison: str) -> None:
    engine = make_engine([healthy], [add_one])
    with pytest.raises(ValueError, match="invalid workflow name"):
        engine.start_workflow("healthy" + POISONS[poison], 1)
    assert engine.list_runs() == []
    _healthy_run_completes(engine)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("field", sorted(START_FIELDS))
def test_start_workflow_refuses_a_poisoned_field(make_engine: Any, field: str, poison: str) -> None:
    engine = make_engine([healthy], [add_one])
    named, kwargs = START_FIELDS[field]
    with pytest.raises(ValueError) as caught:
        engine.start_workflow(healthy, 1, **kwargs(POISONS[poison]))
    assert named in str(caught.value)
    assert engine.list_runs() == []  # nothing was created
    _healthy_run_completes(engine)


@pytest.mark.parametrize("field", ["instance_id", "concurrency_key"])
@pytest.mark.parametrize("value", ["", "k" * 257])
def test_start_workflow_refuses_an_empty_or_overlong_key(make_engine: Any, field: str, value: str) -> None:
    # an index entry holds each of them: 1 to 256 characters, refused at the call otherwise
    engine = make_engine([healthy], [add_one])
    with pytest.raises(ValueError, match=f"{field} must be a non-empty str of at most 256 characters"):
        engine.start_workflow(healthy, 1, **{field: value})
    assert engine.list_runs() == []
    run_id = engine.start_workflow(healthy, 1, **{field: "k" * 256})  # the longest taken
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 2
    _healthy_run_completes(engine)


def test_an_instance_id_with_a_nul_no_longer_collides_with_its_prefix(make_engine: Any) -> None:
    # libpq sends text as C strings: "order\x00A" used to be stored as "order", deduplicating
    # against the live run "order" (its id came back, and nothing was created)
    engine = make_engine([healthy], [add_one])
    first = engine.start_workflow(healthy, 1, instance_id="order")
    with pytest.raises(ValueError, match="instance_id must not contain a NUL"):
        engine.start_workflow(healthy, 2, instance_id="order\x00A")
    assert [r.instance_id for r in engine.list_runs()] == ["order"]
    engine.drain()
    assert engine.wait(first, timeout=5) == 2
    _healthy_run_completes(engine)


RUN_ID_CALLS: dict[str, Callable[[dex.Engine, str], Any]] = {
    "send_event": lambda e, r: e.send_event(r, "go", 1),
    "cancel": lambda e, r: e.cancel(r),
    "suspend": lambda e, r: e.suspend(r),
    "resume": lambda e, r: e.resume(r),
    "get_run": lambda e, r: e.get_run(r),
    "wait": lambda e, r: e.wait(r, timeout=1),
    "history": lambda e, r: e.history(r),
    "export_history": lambda e, r: e.export_history(r),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("call", sorted(RUN_ID_CALLS))
def test_calls_taking_a_run_id_refuse_a_poisoned_one(make_engine: Any, call: str, poison: str) -> None:
    engine = make_engine([healthy, waits], [add_one])
    waiting = engine.start_workflow(waits)
    with pytest.raises(ValueError, match="run_id"):
        RUN_ID_CALLS[call](engine, waiting + POISONS[poison])
    engine.drain()
    assert engine.get_run(waiting).status is dex.RunStatus.RUNNING  # nothing reached it
    engine.send_event(waiting, "go", "now")
    engine.drain()
    assert engine.wait(waiting, timeout=5) == "now"
    _healthy_run_completes(engine)


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_send_event_refuses_a_poisoned_event_id(make_engine: Any, poison: str) -> None:
    engine = make_engine([healthy, waits], [add_one])
    waiting = engine.start_workflow(waits)
    with pytest.raises(ValueError, match="event id"):
        engine.send_event(waiting, "go" + POISONS[poison], 1)
    engine.drain()
    assert [h.kind for h in engine.history(waiting)].count("ExternalEventReceived") == 0
    _healthy_run_completes(engine)


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_cancel_refuses_a_poisoned_reason(make_engine: Any, poison: str) -> None:
    engine = make_engine([healthy, waits], [add_one])
    waiting = engine.start_workflow(waits)
    with pytest.raises(ValueError, match="reason"):
        engine.cancel(waiting, reason="because " + POISONS[poison])
    engine.drain()
    assert engine.get_run(waiting).status is dex.RunStatus.RUNNING  # the cancel was not sent
    engine.cancel(waiting, reason="a readable reason")
    engine.drain()
    assert engine.get_run(waiting).status is dex.RunStatus.CANCELLED
    _healthy_run_completes(engine)


LIST_FILTERS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "workflow_name": ("workflow_name", lambda p: {"workflow_name": p}),
    "instance_id": ("instance_id", lambda p: {"instance_id": p}),
    "label key": ("labels key", lambda p: {"labels": {p: "v"}}),
    "label value": ("labels['k'] value", lambda p: {"labels": {"k": p}}),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("field", sorted(LIST_FILTERS))
def test_list_runs_refuses_a_poisoned_filter(make_engine: Any, field: str, poison: str) -> None:
    engine = make_engine([healthy], [add_one])
    named, kwargs = LIST_FILTERS[field]
    with pytest.raises(ValueError) as caught:
        engine.list_runs(**kwargs(POISONS[poison]))
    assert named in str(caught.value)
    _healthy_run_completes(engine)
    assert len(engine.list_runs()) == 1


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_an_engine_refuses_a_poisoned_node_id(adapter_factory: Any, poison: str) -> None:
    # the node id is the owner of every lease the engine takes: a text column
    with pytest.raises(ValueError, match="node_id"):
        dex.Engine(adapter_factory(), workflows=[healthy], activities=[add_one], node_id="node" + POISONS[poison])


# -- in workflow code, at the call ---------------------------------------------------------------
WORKFLOW_FIELDS = {
    "set_status": "status",
    "child instance_id": "instance_id",
    "child concurrency_key": "concurrency_key",
    "child label key": "labels key",
    "child label value": "labels['k'] value",
    "child queue": "queue name",
    "wait_for_event": "event id",
    "side_effect": "side effect name",
    "activity name": "invalid activity name",
    "child workflow name": "invalid workflow name",
}


async def _poisoned_step(ctx: dex.WorkflowContext, where: str, text: str) -> None:
    if where == "set_status":
        ctx.set_status(text)
    elif where == "child instance_id":
        await ctx.child(healthy, 1, instance_id=text)
    elif where == "child concurrency_key":
        await ctx.child(healthy, 1, concurrency_key=text)
    elif where == "child label key":
        await ctx.child(healthy, 1, labels={text: "v"})
    elif where == "child label value":
        await ctx.child(healthy, 1, labels={"k": text})
    elif where == "child queue":
        await ctx.child(healthy, 1, queue=text)
    elif where == "wait_for_event":
        await ctx.wait_for_event(text)
    elif where == "side_effect":
        ctx.side_effect(text, lambda: 1)
    elif where == "activity name":
        await ctx.activity("add_one" + text, 1)
    elif where == "child workflow name":
        await ctx.child("healthy" + text, 1)
    else:  # pragma: no cover
        raise AssertionError(where)


@dex.workflow
async def catches_the_refusal(ctx: dex.WorkflowContext, where: str, poison: str) -> str:
    # the poison is looked up here: a lone surrogate cannot even travel as an argument
    try:
        await _poisoned_step(ctx, where, POISONS[poison])
    except ValueError as exc:
        ctx.set_status("recovered")
        return f"refused: {exc}"
    return "accepted"


@dex.workflow
async def does_not_catch(ctx: dex.WorkflowContext, where: str, poison: str) -> str:
    await _poisoned_step(ctx, where, POISONS[poison])
    return "accepted"


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("where", sorted(WORKFLOW_FIELDS))
def test_workflow_code_gets_the_refusal_at_the_call(make_engine: Any, where: str, poison: str) -> None:
    engine = make_engine([healthy, catches_the_refusal, does_not_catch], [add_one])
    caught = engine.start_workflow(catches_the_refusal, where, poison)
    failed = engine.start_workflow(does_not_catch, where, poison)
    engine.drain()
    # the code that catches the ValueError goes on and completes
    result = engine.wait(caught, timeout=5)
    assert result.startswith("refused: ") and WORKFLOW_FIELDS[where] in result
    assert engine.get_run(caught).custom_status == "recovered"
    # the code that does not fails with it, like any exception escaping workflow code
    with pytest.raises(dex.WorkflowFailedError) as failure:
        engine.wait(failed, timeout=5)
    assert failure.value.failure.type == "ValueError"
    assert WORKFLOW_FIELDS[where] in failure.value.failure.message
    assert engine.get_run(failed).custom_status is None
    # nothing poisoned was stored: no child run exists, and the other runs go on
    assert {r.run_id for r in engine.list_runs()} == {caught, failed}
    _healthy_run_completes(engine)


@dex.workflow
async def poisons_status_then_works(ctx: dex.WorkflowContext, poison: str) -> int:
    ctx.set_status(POISONS[poison])  # not caught: the run fails here
    return await ctx.activity(add_one, 1)  # type: ignore[no-any-return]


@dex.workflow
async def poisons_a_child(ctx: dex.WorkflowContext, poison: str) -> int:
    await ctx.activity(add_one, 1)
    return await ctx.child(healthy, 1, instance_id=POISONS[poison])  # type: ignore[no-any-return]


def test_a_started_engine_keeps_running_healthy_runs_beside_poisoned_ones(adapter_factory: Any) -> None:
    # the symptom: one poisoned status failed the batch flush forever, and every run stalled
    engine = dex.Engine(
        adapter_factory(),
        workflows=[healthy, poisons_status_then_works, poisons_a_child],
        activities=[add_one],
        poll_interval=0.01,
    )
    with engine:
        poisoned = [
            engine.start_workflow(workflow, poison)
            for _ in range(3)
            for workflow in (poisons_status_then_works, poisons_a_child)
            for poison in sorted(POISONS)
        ]
        fine = [engine.start_workflow(healthy, i) for i in range(20)]
        assert [engine.wait(r, timeout=15) for r in fine] == [i + 1 for i in range(20)]
        for run_id in poisoned:
            with pytest.raises(dex.WorkflowFailedError) as caught:
                engine.wait(run_id, timeout=15)
            assert caught.value.failure.type == "ValueError"
            assert "must not contain a NUL" in caught.value.failure.message or "lone surrogate" in (
                caught.value.failure.message
            )
        after = engine.start_workflow(healthy, 100)
        assert engine.wait(after, timeout=15) == 101


# -- the in-memory adapter refuses what PostgreSQL refuses ---------------------------------------
def test_the_in_memory_adapter_refuses_what_postgresql_cannot_store() -> None:
    store = InMemoryAdapter()
    now = store.clock.now()

    def created(**fields: Any) -> ev.RunCreated:
        return ev.RunCreated(workflow_name="w", input=(), queue="default", random_seed=1, **fields)

    for poison in POISONS.values():
        for field, event in [
            ("instance_id", created(instance_id=poison)),
            ("concurrency_key", created(concurrency_key=poison)),
            ("labels key", created(labels=((poison, "v"),))),
            ("labels['k'] value", created(labels=(("k", poison),))),
        ]:
            with pytest.raises(ValueError, match=field.replace("[", r"\[")):
                store.create_run("r1", event, now)
        with pytest.raises(ValueError, match="run_id"):
            store.get_run(poison)
    # a NUL is only a byte inside protobuf (events, messages, failures): PostgreSQL stores it
    store.create_run("r1", created(), now)
    event = ev.ExternalEventReceived(event_id="e\x00", payload=Payload(encoding="json/plain", data=b"\x00"))
    store.send_message("r1", event, now)
    store.request_transition("r1", dex.RunStatus.CANCELLED, ev.RunCancelled(reason="a\x00b"), now)
    with pytest.raises(ValueError, match="lone surrogate"):
        store.request_transition("r1", dex.RunStatus.CANCELLED, ev.RunCancelled(reason="a\ud800b"), now)
    assert [r.run_id for r in store.list_runs(RunFilter())] == ["r1"]


class _HostileKey:
    """A label key that is not a str and whose repr() raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    def __hash__(self) -> int:
        return 1


def test_a_label_key_that_cannot_be_printed_gets_the_labels_type_error(make_engine: Any) -> None:
    engine = make_engine(workflows=[healthy], activities=[add_one])
    with pytest.raises(TypeError, match="labels must map str to str, got a _HostileKey key with a str value"):
        engine.start_workflow(healthy, 1, labels={_HostileKey(): "v"})
    assert engine.list_runs(limit=10) == []  # nothing was stored
    _healthy_run_completes(engine)
