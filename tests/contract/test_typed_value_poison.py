"""NUL and lone surrogates in strings inside typed values, on every adapter (docs/reference/contract.md §2, §15).

A NUL is an ordinary character of a JSON string: it crosses whole. A lone surrogate cannot be
written as UTF-8: the value holding it is refused at the call that tried to send it, naming the
argument, and nothing is stored; sent from an activity, it fails that activity once, terminally.
Each test ends with a healthy run completing.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

import dex

POISONS = {"nul": "a\x00b", "surrogate": "a\ud800b"}


@dataclasses.dataclass(frozen=True)
class Note:
    when: datetime
    text: str
    tags: frozenset[str] = frozenset()
    prices: dict[str, Decimal] = dataclasses.field(default_factory=dict)
    pair: tuple[uuid.UUID, str] | None = None


WHEN = datetime(2026, 12, 1, tzinfo=UTC)


def poisoned(where: str, poison: str) -> Note:
    return {
        "field": Note(when=WHEN, text=poison),
        "set item": Note(when=WHEN, text="ok", tags=frozenset({"x", poison})),
        "dict key": Note(when=WHEN, text="ok", prices={poison: Decimal("1.5")}),
        "tuple item": Note(when=WHEN, text="ok", pair=(uuid.UUID(int=3), poison)),
    }[where]


WHERE = ["field", "set item", "dict key", "tuple item"]


@dex.activity
def keep(note: Note) -> Note:
    return note


@dex.activity
def spoil(where: str) -> Note:
    return poisoned(where, POISONS["surrogate"])


@dex.workflow
async def relay(ctx: dex.WorkflowContext, note: Note) -> Note:
    return await ctx.activity(keep, note)  # type: ignore[no-any-return]


@dex.workflow
async def spoils(ctx: dex.WorkflowContext, where: str) -> Note:
    return await ctx.activity(spoil, where)  # type: ignore[no-any-return]


@dex.workflow
async def sends_on(ctx: dex.WorkflowContext, where: str) -> str:
    try:
        await ctx.activity(keep, poisoned(where, POISONS["surrogate"]))
    except dex.SerializationError as exc:  # raised at the call, where the code may catch it
        return str(exc)
    return "sent"


def _a_healthy_run_completes(engine: dex.Engine) -> None:
    note = Note(when=WHEN, text="fine", tags=frozenset({"t"}))
    run_id = engine.start_workflow(relay, note)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == note


def _engine(make_engine: Any) -> dex.Engine:
    engine: dex.Engine = make_engine([relay, spoils, sends_on], [keep, spoil])
    return engine


@pytest.mark.parametrize("where", WHERE)
def test_a_nul_inside_a_typed_value_crosses_whole(make_engine: Any, where: str) -> None:
    engine = _engine(make_engine)
    note = poisoned(where, POISONS["nul"])
    run_id = engine.start_workflow(relay, note)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == note
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize("where", WHERE)
def test_a_lone_surrogate_inside_a_typed_value_is_refused_at_the_start(make_engine: Any, where: str) -> None:
    engine = _engine(make_engine)
    with pytest.raises(dex.SerializationError, match=r"argument 0: value of type Note .*not valid Unicode"):
        engine.start_workflow(relay, poisoned(where, POISONS["surrogate"]))
    assert engine.list_runs() == []
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize("where", WHERE)
def test_a_lone_surrogate_inside_an_event_is_refused_at_the_call(make_engine: Any, where: str) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(relay, Note(when=WHEN, text="waiting"))
    with pytest.raises(dex.SerializationError, match="not valid Unicode"):
        engine.send_event(run_id, "go", poisoned(where, POISONS["surrogate"]))
    assert [e.kind for e in engine.history(run_id) if e.kind == "ExternalEventReceived"] == []
    engine.drain()
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize("where", WHERE)
def test_workflow_code_gets_the_refusal_where_it_sends_the_value(make_engine: Any, where: str) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(sends_on, where)
    engine.drain()
    said = engine.wait(run_id, timeout=5)
    assert said.startswith("activity 'keep' argument 0: value of type Note") and "not valid Unicode" in said
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize("where", WHERE)
def test_an_activity_returning_one_fails_once_with_a_recorded_failure(make_engine: Any, where: str) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(spoils, where)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and "not valid Unicode" in str(info.failure)
    failed = [e.event for e in engine.history(run_id) if e.kind == "ActivityTaskFailed"]
    assert [f.failure.terminal for f in failed] == [True]  # type: ignore[attr-defined]
    _a_healthy_run_completes(engine)
