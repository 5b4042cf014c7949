"""Poison for ``engine.update`` and ``engine.query``, on every adapter (docs/reference/contract.md
§8 and §14): bad text where it enters, hostile exceptions from handlers and validators, and a
store that fails in the middle of an update. Each poisoned call gets its own clear error, and a
healthy update, query and run afterwards still work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import dex
from dex.app.ports.store import Store

Make = Callable[..., dex.Engine]

BAD_TEXTS = [("\x00", "NUL"), ("\ud800", "lone surrogate")]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")

    def __repr__(self) -> str:
        raise RuntimeError("nor shown")


class Hostile(BaseException):
    """Not an Exception: ``except Exception`` does not catch it."""


@dex.workflow(name="upd-poison")
async def poisoned(ctx: dex.WorkflowContext) -> list[str]:
    seen: list[str] = []

    @ctx.on_update("echo")
    def echo(text: str) -> str:
        seen.append(text)
        return text

    @ctx.on_update("raise")
    def raise_(kind: str) -> None:
        if kind == "unprintable":
            raise Unprintable()
        if kind == "base":
            raise Hostile("a BaseException")
        if kind == "exit":
            raise SystemExit(3)

    @raise_.validator
    def _(kind: str) -> None:
        if kind == "validator-unprintable":
            raise Unprintable()
        if kind == "validator-base":
            raise Hostile("refused hard")

    @ctx.on_query("seen")
    def read(kind: str = "") -> list[str]:
        if kind == "unprintable":
            raise Unprintable()
        if kind == "base":
            raise Hostile("a BaseException")
        return list(seen)

    await ctx.wait_condition(lambda: "stop" in seen)
    return seen


def healthy(engine: dex.Engine, run_id: str, *before: str) -> None:
    """A healthy update and query work, and the run then ends with what it was told."""
    assert engine.update(run_id, "echo", "fine", timeout=20) == "fine"
    assert engine.query(run_id, "seen") == [*before, "fine"]
    engine.update(run_id, "echo", "stop", timeout=20)
    assert engine.wait(run_id, timeout=20) == [*before, "fine", "stop"]


@pytest.mark.parametrize(("bad", "what"), BAD_TEXTS)
def test_bad_text_in_names_and_ids_is_refused_at_the_call(make_engine: Make, bad: str, what: str) -> None:
    engine = make_engine(workflows=[poisoned])
    run_id = engine.start_workflow(poisoned)
    engine.drain(advance_time=False)
    history = engine.history(run_id)
    shown = "NUL" if what == "NUL" else "lone surrogate"
    with pytest.raises(ValueError, match=f"update name .*{shown}"):
        engine.update(run_id, f"echo{bad}", "x")
    with pytest.raises(ValueError, match=f"update id .*{shown}"):
        engine.update(run_id, "echo", "x", update_id=f"id{bad}")
    with pytest.raises(ValueError, match=f"query name .*{shown}"):
        engine.query(run_id, f"seen{bad}")
    with pytest.raises(ValueError, match=f"run_id .*{shown}"):
        engine.update(f"{run_id}{bad}", "echo", "x")
    engine.drain(advance_time=False)
    assert engine.history(run_id) == history  # nothing was written
    healthy(engine, run_id)


def test_arguments_with_a_nul_go_through_and_a_lone_surrogate_is_refused(make_engine: Make) -> None:
    engine = make_engine(workflows=[poisoned])
    run_id = engine.start_workflow(poisoned)
    assert engine.update(run_id, "echo", "a\x00b") == "a\x00b"  # stored faithfully
    with pytest.raises(dex.SerializationError, match="surrogate"):
        engine.update(run_id, "echo", "a\ud800b")
    with pytest.raises(dex.SerializationError, match="surrogate"):
        engine.query(run_id, "seen", "a\ud800b")
    healthy(engine, run_id, "a\x00b")


@pytest.mark.parametrize(
    ("kind", "error", "shown"),
    [
        ("unprintable", dex.UpdateFailedError, "Unprintable: <unprintable Unprintable"),
        ("base", dex.UpdateFailedError, "Hostile: a BaseException"),
        ("exit", dex.UpdateFailedError, "SystemExit: 3"),
        ("validator-unprintable", dex.UpdateRejectedError, "Unprintable: <unprintable Unprintable"),
        ("validator-base", dex.UpdateRejectedError, "Hostile: refused hard"),
    ],
)
def test_hostile_exceptions_of_handlers_and_validators_are_the_callers_error(
    make_engine: Make, kind: str, error: type[Exception], shown: str
) -> None:
    engine = make_engine(workflows=[poisoned])
    run_id = engine.start_workflow(poisoned)
    with pytest.raises(error) as caught:
        engine.update(run_id, "raise", kind, timeout=20)
    assert shown in str(caught.value)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    healthy(engine, run_id)


@pytest.mark.parametrize("kind", ["unprintable", "base"])
def test_hostile_exceptions_of_queries_are_query_errors(make_engine: Make, kind: str) -> None:
    engine = make_engine(workflows=[poisoned])
    run_id = engine.start_workflow(poisoned)
    with pytest.raises(dex.QueryError, match=r"Unprintable|Hostile"):
        engine.query(run_id, "seen", kind)
    healthy(engine, run_id)


class FailingAnswers:
    """A store whose named calls fail (``ConnectionError``) ``times`` times each while armed;
    with ``after``, the call is made first and its acknowledgement lost."""

    def __init__(self, store: Store, names: tuple[str, ...], times: int, *, after: bool = False) -> None:
        self.store, self.names, self.after = store, names, after
        self.left = dict.fromkeys(names, times)
        self.lock = threading.Lock()

    @property
    def clock(self) -> Any:
        return self.store.clock

    def close(self) -> None:
        self.store.close()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if name not in self.names:
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                fail = self.left[name] > 0
                self.left[name] -= fail
            if not fail:
                return target(*args, **kwargs)
            if self.after:
                target(*args, **kwargs)
            raise ConnectionError(f"injected: connection lost {'after' if self.after else 'during'} {name}")

        return call


def test_a_store_that_fails_to_take_the_request_is_a_clear_error_at_the_call(
    adapter_factory: Callable[[], Any],
) -> None:
    store = FailingAnswers(adapter_factory(), ("request_update",), times=1)
    engine = dex.Engine(store, workflows=[poisoned])  # type: ignore[arg-type]
    run_id = engine.start_workflow(poisoned)
    with pytest.raises(ConnectionError, match="request_update"):
        engine.update(run_id, "echo", "lost")
    engine.drain(advance_time=False)
    assert engine.query(run_id, "seen") == []  # nothing arrived
    healthy(engine, run_id)


def test_a_request_whose_acknowledgement_was_lost_is_answered_once_when_sent_again(
    adapter_factory: Callable[[], Any],
) -> None:
    store = FailingAnswers(adapter_factory(), ("request_update",), times=1, after=True)
    engine = dex.Engine(store, workflows=[poisoned])  # type: ignore[arg-type]
    run_id = engine.start_workflow(poisoned)
    with pytest.raises(ConnectionError, match="after request_update"):
        engine.update(run_id, "echo", "once", update_id="u-lost")
    assert engine.update(run_id, "echo", "once", update_id="u-lost", timeout=20) == "once"
    assert engine.query(run_id, "seen") == ["once"]  # the handler ran once
    healthy(engine, run_id, "once")


def test_a_store_that_fails_while_the_caller_waits_is_read_again(adapter_factory: Callable[[], Any]) -> None:
    store = FailingAnswers(adapter_factory(), ("update_answer", "wait_update_answer"), times=3)
    engine = dex.Engine(store, workflows=[poisoned])  # type: ignore[arg-type]
    run_id = engine.start_workflow(poisoned)
    assert engine.update(run_id, "echo", "patient", timeout=20) == "patient"
    healthy(engine, run_id, "patient")


def test_a_store_that_keeps_failing_times_the_update_out_saying_so(adapter_factory: Callable[[], Any]) -> None:
    store = FailingAnswers(adapter_factory(), ("update_answer", "wait_update_answer"), times=10**6)
    engine = dex.Engine(store, workflows=[poisoned])  # type: ignore[arg-type]
    run_id = engine.start_workflow(poisoned)
    with pytest.raises(TimeoutError, match="store was failing") as caught:
        engine.update(run_id, "echo", "lost", update_id="u-fail", timeout=0.5)
    assert isinstance(caught.value.__cause__, ConnectionError)
    store.left = dict.fromkeys(store.names, 0)
    assert engine.update(run_id, "echo", "lost", update_id="u-fail", timeout=20) == "lost"  # answered meanwhile
    healthy(engine, run_id, "lost")
