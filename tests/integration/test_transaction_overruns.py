"""A transaction step's attempt is bounded by its ``lock_timeout`` (docs/reference/contract.md §8), on a real
PostgreSQL: a step that waits too long (a slow query, a lock another transaction holds) has its
transaction ended and rolled back, and the attempt fails with a ``TimeoutError`` that names the
step and the limit; the retries follow its policy, and a healthy run afterwards completes.

``@dex.transaction`` takes no ``lock_timeout`` (its default is five minutes): these tests give
their steps one second through the definition the decorator made."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE

pytestmark = pytest.mark.postgres

TWICE = dex.RetryPolicy(initial_delay=timedelta(milliseconds=10), max_attempts=2, randomization_factor=0)
STATE: dict[str, Any] = {}


def _bounded(fn: Any, seconds: float = 1.0) -> Any:
    definition = getattr(fn, ACTIVITY_ATTRIBUTE)
    setattr(fn, ACTIVITY_ATTRIBUTE, attrs.evolve(definition, lock_timeout=timedelta(seconds=seconds)))
    return fn


@_bounded
@dex.transaction(name="sleeps-in-sql", retry=TWICE)
def sleeps_in_sql(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    conn.execute("SELECT pg_sleep(30)")
    return note


@_bounded
@dex.transaction(name="sleeps-async", retry=TWICE)
async def sleeps_async(conn: Any, note: str) -> str:
    await conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    await conn.execute("SELECT pg_sleep(30)")
    return note


@_bounded
@dex.transaction(name="waits-for-a-lock", retry=TWICE)
def waits_for_a_lock(conn: Any, note: str) -> str:
    conn.execute(f"UPDATE {STATE['table']} SET note = %s WHERE id = 1", [note])  # row 1 is held by the test
    return note


@_bounded
@dex.transaction(name="writes", retry=TWICE)
def writes(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    return note


@_bounded
@dex.transaction(name="hangs-when-told", retry=TWICE)
def hangs_when_told(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    if STATE.get("hangs", 0) > 0:  # the first so many attempts hang
        STATE["hangs"] -= 1
        conn.execute("SELECT pg_sleep(30)")
    return note


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


@_bounded
@dex.transaction(name="swallows-the-end", retry=TWICE)
def swallows_the_end(conn: Any, how: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [how])
    try:
        conn.execute("SELECT pg_sleep(30)")
    except psycopg.Error:  # its session was ended: the function hides it, or raises something else
        if how == "unprintable":
            raise Unprintable() from None
        if how == "base-exception":
            raise SystemExit(3) from None
    return how


@dex.workflow(name="one-step")
async def one_step(ctx: dex.WorkflowContext, step: str, note: str) -> str:
    result: str = await ctx.activity(step, note)
    return result


STEPS = [sleeps_in_sql, sleeps_async, waits_for_a_lock, writes, hangs_when_told, swallows_the_end]


@pytest.fixture
def table(pg_dsn: str, pg_schema: str) -> str:
    name = sql.Identifier(pg_schema, "app").as_string(None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(pg_schema).as_string(None)}")
        conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, note text)")
        conn.execute(f"INSERT INTO {name} (note) VALUES ('first')")
    STATE.clear()
    STATE.update(dsn=pg_dsn, table=name)
    return name


def _notes(table: str) -> list[str]:
    with psycopg.connect(STATE["dsn"]) as conn:
        return [row[0] for row in conn.execute(f"SELECT note FROM {table} ORDER BY id")]


@pytest.mark.parametrize("step", ["sleeps-in-sql", "sleeps-async", "waits-for-a-lock"])
def test_a_step_that_runs_past_its_lock_timeout_fails_rolled_back_and_the_next_run_completes(
    make_adapter: Callable[..., PostgresAdapter], table: str, step: str
) -> None:
    engine = dex.Engine(make_adapter(), [one_step], STEPS)
    with psycopg.connect(STATE["dsn"]) as holder:  # an application transaction holding row 1 throughout
        holder.execute(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
        run_id = engine.start_workflow(one_step, step, "overran")
        started = time.monotonic()
        engine.drain()
        took = time.monotonic() - started
        with pytest.raises(dex.WorkflowFailedError) as failed:
            engine.wait(run_id, timeout=5)
        assert holder.execute("SELECT 1").fetchone() == (1,)  # the application's own transaction is untouched
    message = str(failed.value.failure)
    assert "TimeoutError" in message and "lock_timeout" in message and step in message, message
    assert 2 <= took < 20, took  # two attempts of about a second each, not two of 30 s
    assert _notes(table) == ["first"]  # nothing either attempt wrote stayed
    healthy = engine.start_workflow(one_step, "writes", "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "healthy"
    assert _notes(table) == ["first", "healthy"]


def test_a_step_that_ends_in_time_is_not_touched_by_its_watch(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [one_step], STEPS)
    run_ids = [engine.start_workflow(one_step, "writes", f"note-{i}") for i in range(5)]
    engine.drain()
    assert [engine.wait(run_id, timeout=5) for run_id in run_ids] == [f"note-{i}" for i in range(5)]
    time.sleep(1.5)  # past every watch's limit: none of them fires at a connection given back
    healthy = engine.start_workflow(one_step, "writes", "after")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "after"
    assert _notes(table) == ["first", *(f"note-{i}" for i in range(5)), "after"]


def test_a_group_that_runs_past_the_limit_is_ended_and_its_step_goes_on_as_a_task(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    adapter = make_adapter()
    groups: list[BaseException | None] = []
    real = adapter.checkpoint_steps

    def spy(items: Any, now: Any) -> Any:
        try:
            outcome = real(items, now)
        except BaseException as exc:
            groups.append(exc)
            raise
        groups.append(None)
        return outcome

    adapter.checkpoint_steps = spy  # type: ignore[method-assign]
    engine = dex.Engine(adapter, [one_step], STEPS, inline_activity_seconds=0.5)  # quick steps may group
    engine.start()
    try:
        assert engine.wait(engine.start_workflow(one_step, "hangs-when-told", "warm"), timeout=30) == "warm"
        STATE["hangs"] = 1  # its attempt in the group; as a task of its own it goes through
        run_id = engine.start_workflow(one_step, "hangs-when-told", "hung")
        started = time.monotonic()
        assert engine.wait(run_id, timeout=30) == "hung"
        took = time.monotonic() - started
        healthy = engine.start_workflow(one_step, "writes", "healthy")
        assert engine.wait(healthy, timeout=30) == "healthy"
    finally:
        engine.stop(timeout=10)
    failures = [exc for exc in groups if exc is not None]
    assert len(failures) == 1, groups
    cause = getattr(failures[0], "cause", None)  # a StepFailed: the group's steps then go on as tasks
    assert isinstance(cause, TimeoutError) and "lock_timeout" in str(cause) and "hangs-when-told" in str(cause)
    assert took < 15, took
    assert _notes(table) == ["first", "warm", "hung", "healthy"]  # the ended group's write rolled back


@pytest.mark.parametrize("how", ["returns", "unprintable", "base-exception"])
def test_a_step_that_hides_its_ended_session_still_fails_with_the_timeout(
    make_adapter: Callable[..., PostgresAdapter], table: str, how: str
) -> None:
    engine = dex.Engine(make_adapter(), [one_step], STEPS)
    run_id = engine.start_workflow(one_step, "swallows-the-end", how)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id, timeout=5)
    message = str(failed.value.failure)
    assert "TimeoutError" in message and "lock_timeout" in message and "swallows-the-end" in message, message
    assert _notes(table) == ["first"]
    healthy = engine.start_workflow(one_step, "writes", "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "healthy"


def test_a_watch_that_cannot_reach_the_server_leaves_the_step_to_its_statement_timeout(
    make_adapter: Callable[..., PostgresAdapter], table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dex.adapters.postgres import overruns

    made = overruns.Overrun.__init__

    def unreachable(self: overruns.Overrun, *args: Any) -> None:
        made(self, *args)
        self._conninfo = "host=/nonexistent-dex-test dbname=none connect_timeout=1"  # the watch's server is gone

    monkeypatch.setattr(overruns.Overrun, "__init__", unreachable)
    engine = dex.Engine(make_adapter(statement_timeout=timedelta(seconds=2)), [one_step], STEPS)
    run_id = engine.start_workflow(one_step, "sleeps-in-sql", "unwatched")
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id, timeout=5)
    assert "statement timeout" in str(failed.value.failure)  # as before the watch: the server's limit
    monkeypatch.undo()
    assert _notes(table) == ["first"]
    healthy = engine.start_workflow(one_step, "writes", "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "healthy"
