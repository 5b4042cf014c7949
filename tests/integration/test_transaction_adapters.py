"""A ``@dex.transaction`` step may register dumpers and loaders on its connection
(``conn.adapters``): they serve the step's own statements and go with the step. Before, they
stayed on the pooled connection, where dex's own statements and other runs' steps met them
next (a dumper of ``str`` that raises had the engine's writes on that connection fail).

Each case poisons the adapters as a task of its own and then inside its workflow task (a
group), def and async def, checks every connection of the pool directly, and runs healthy
workflows after it, with no engine thread failing a round meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.adapt import Dumper, Loader

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.integration.step_groups import count_groups

pytestmark = pytest.mark.postgres

POOL = 3  # few connections: the poisoned one is soon the engine's again


class RefusingDumper(Dumper):
    """Dumps no ``str`` at all."""

    def dump(self, obj: Any) -> bytes:
        raise RuntimeError("this dumper refuses every str")


class ShoutingLoader(Loader):
    """Reads ``text`` in upper case."""

    def load(self, data: Any) -> str:
        return bytes(data).decode().upper()


def _poison(conn: Any) -> None:
    conn.adapters.register_loader("text", ShoutingLoader)
    conn.adapters.register_dumper(str, RefusingDumper)


@dex.transaction(name="adapts")
def adapts(conn: Any, word: str) -> str:
    _poison(conn)
    # the step's own statements see what it registered
    row = conn.execute("SELECT 'hello'::text").fetchone()
    return f"{word}: {row[0]}" if row is not None else ""


@dex.transaction(name="adapts-async")
async def adapts_async(conn: Any, word: str) -> str:
    _poison(conn)
    cursor = await conn.execute("SELECT 'hello'::text")
    row = await cursor.fetchone()
    return f"{word}: {row[0]}" if row is not None else ""


@dex.transaction(name="echoes")
def echoes(conn: Any, word: str) -> str:
    row = conn.execute("SELECT %s::text", [word]).fetchone()
    return str(row[0]) if row is not None else ""


@dex.activity(name="plain-adapters")
def plain(word: str) -> str:
    return word + "!"


@dex.workflow(name="adapter-poisoner")
async def poisoner(ctx: dex.WorkflowContext, asynchronous: bool, word: str) -> str:
    result: str = await ctx.activity(adapts_async if asynchronous else adapts, word)
    return result


@dex.workflow(name="adapter-healthy")
async def healthy(ctx: dex.WorkflowContext, word: str) -> str:
    word = await ctx.activity(plain, word)
    result: str = await ctx.activity(echoes, word)
    return result


def _pool_connections(adapter: PostgresAdapter) -> list[tuple[Any, Any]]:
    """What every connection of the adapter's pool does with a str parameter and a text result."""
    adapter._kept.release()  # the start's kept connection, back in the pool to be looked at too
    pool = adapter._pool
    taken = [pool.getconn(timeout=10) for _ in range(POOL)]
    try:
        return [
            (conn.adapters.get_dumper(str, psycopg.adapt.PyFormat.TEXT), conn.execute("SELECT %s", ["ok"]).fetchone())
            for conn in taken
        ]
    finally:
        for conn in taken:
            pool.putconn(conn)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["def", "async-def"])
def test_adapters_a_step_registers_go_with_the_step(
    make_adapter: Callable[..., PostgresAdapter], caplog: pytest.LogCaptureFixture, asynchronous: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="dex.runner")
    adapter = make_adapter(max_connections=POOL)
    groups = count_groups(adapter)
    default_dumper = psycopg.adapters.get_dumper(str, psycopg.adapt.PyFormat.TEXT)
    engine = dex.Engine(
        adapter, [poisoner, healthy], [adapts, adapts_async, echoes, plain], inline_activity_seconds=0.5
    )
    engine.start()
    try:
        # first as a task of its own (its duration is not known yet), then in a group (def only)
        for _ in range(2):
            assert engine.wait(engine.start_workflow(poisoner, asynchronous, "hello"), timeout=30) == "hello: HELLO"
        assert bool(groups) is not asynchronous, "the second def step was to run in a group (async def steps never do)"
        assert _pool_connections(adapter) == [(default_dumper, ("ok",))] * POOL
        run_ids = [engine.start_workflow(healthy, f"w{i}") for i in range(30)]
        assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [f"w{i}!" for i in range(30)]
    finally:
        engine.stop(timeout=10)
    assert [r.getMessage() for r in caplog.records if r.name == "dex.runner" and r.levelno >= logging.WARNING] == []
