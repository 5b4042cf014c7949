"""Fixtures for the command-line tests: a schema with runs in known states, and a runner.

The runs are made by a small engine in the test process over a virtual clock (so a five-minute
timer takes no time and creation times are known); the commands under test then read and
change them through ``dex.cli.cli``, exactly as a user would, with ``DEX_DATABASE_URL`` set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from click.testing import CliRunner, Result

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.cli import cli
from dex.testing import VirtualClock
from tests.pg import fresh_schema, postgres_dsn

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


@dex.activity(name="cli-greet")
def greet(name: str) -> str:
    return f"hello {name}"


@dex.activity(name="cli-explode", retry=dex.RetryPolicy(max_attempts=1))
def explode(code: int) -> int:
    raise ValueError(f"boom {code}")


@dex.workflow(name="cli-child")
async def child(ctx: dex.WorkflowContext, n: int) -> int:
    return n * 2


@dex.workflow(name="cli-order")
async def order(ctx: dex.WorkflowContext, name: str) -> dict[str, Any]:
    greeting = await ctx.activity(greet, name)
    await ctx.sleep(timedelta(minutes=5))
    doubled = await ctx.child(child, 21)
    packed = await ctx.wait_for_event("packed")
    ctx.set_status("packed")
    return {"greeting": greeting, "doubled": doubled, "packed": packed}


@dex.workflow(name="cli-failing")
async def failing(ctx: dex.WorkflowContext) -> int:
    return await ctx.activity(explode, 7)


WORKFLOWS: list[Callable[..., Any]] = [order, child, failing]
ACTIVITIES: list[Callable[..., Any]] = [greet, explode]


@attrs.frozen
class World:
    """A schema and the engine (with the test workflows) that made its runs."""

    dsn: str
    schema: str
    engine: dex.Engine
    clock: VirtualClock

    def invoke(self, *args: str, input: str | None = None, env: Mapping[str, str | None] | None = None) -> Result:
        """``dex ARGS --schema SCHEMA`` with DEX_DATABASE_URL set (the schema option goes first,
        so that commands which take no --schema of their own still get it)."""
        return invoke("--schema", self.schema, *args, input=input, env={"DEX_DATABASE_URL": self.dsn, **(env or {})})


def invoke(*args: str, input: str | None = None, env: Mapping[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def one_line_error(result: Result) -> str:
    """The single ``error: ...`` line a failed command printed (and nothing on stdout)."""
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return postgres_dsn()


def _world(dsn: str, schema: str) -> Iterator[World]:
    clock = VirtualClock(T0)
    adapter = PostgresAdapter(dsn, schema=schema, clock=clock, max_connections=4)
    try:
        yield World(dsn, schema, dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES), clock)
    finally:
        adapter.close()


@pytest.fixture
def world(pg_dsn: str) -> Iterator[World]:
    """An empty migrated schema of this test's own (for commands that change things)."""
    with fresh_schema(pg_dsn, prefix="dex_cli") as schema:
        yield from _world(pg_dsn, schema)


@attrs.frozen
class Runs:
    """The runs of the shared read-only schema: ann (completed), bob (waiting for an event),
    their child runs, and a failed run."""

    world: World
    ann: str
    bob: str
    child: str  # ann's
    bob_child: str
    failed: str


@pytest.fixture(scope="module")
def runs(pg_dsn: str) -> Iterator[Runs]:
    with fresh_schema(pg_dsn, prefix="dex_cli_ro") as schema:
        for world in _world(pg_dsn, schema):
            engine, clock = world.engine, world.clock
            ann = engine.start_workflow(order, "ann", labels={"team": "a", "env": "prod"})
            engine.drain()  # ann: greeted, timer elapsed, child done; waits for "packed"
            clock.advance_to(T0 + timedelta(hours=1))
            bob = engine.start_workflow(order, "bob", labels={"team": "b"})
            engine.drain()
            clock.advance_to(T0 + timedelta(hours=2))
            failed = engine.start_workflow(failing)
            engine.send_event(ann, "packed", {"by": "warehouse-7"})
            engine.drain()
            children = {r.parent_run_id: r.run_id for r in engine.list_runs(workflow_name="cli-child")}
            yield Runs(world, ann, bob, children[ann], children[bob], failed)
