"""`dex runs show` prints what a run published and streamed (docs/reference/contract.md §14)."""

from __future__ import annotations

import json

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.cli.conftest import World

pytestmark = pytest.mark.postgres


@dex.workflow(name="cli-publisher")
async def publisher(ctx: dex.WorkflowContext) -> None:
    ctx.publish("stage", "packing")
    ctx.publish("stage", {"name": "shipped", "parcels": 2})
    ctx.publish("eta", "tomorrow")
    for step in ("picked", "packed"):
        await ctx.write_stream("progress", step)
    ctx.close_stream("progress")
    await ctx.write_stream("log", "one line")


def test_show_prints_published_values_and_streams(world: World) -> None:
    adapter = PostgresAdapter(world.dsn, schema=world.schema, clock=world.clock, max_connections=2)
    try:
        engine = dex.Engine(adapter, workflows=[publisher])
        run_id = engine.start_workflow(publisher)
        engine.drain()
    finally:
        adapter.close()
    shown = world.invoke("runs", "show", run_id)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    start = lines.index("published values: 2")
    assert [line.split(None, 1) for line in lines[start + 1 : start + 4]] == [
        ["KEY", "VALUE"],
        ["eta", '"tomorrow"'],
        ["stage", '{"name": "shipped", "parcels": 2}'],
    ]
    start = lines.index("streams: 2")
    assert [line.split() for line in lines[start + 1 : start + 4]] == [
        ["STREAM", "ITEMS", "STATE"],
        ["log", "1", "open"],
        ["progress", "2", "closed"],
    ]
    document = json.loads(world.invoke("runs", "show", run_id, "--json").stdout)
    assert document["published"] == {"eta": "tomorrow", "stage": {"name": "shipped", "parcels": 2}}
    assert document["streams"] == [
        {"key": "log", "length": 1, "closed": False},
        {"key": "progress", "length": 2, "closed": True},
    ]


def test_show_of_a_run_that_published_nothing_has_no_such_part(world: World) -> None:
    run_id = world.engine.start_workflow("cli-child", 1)
    world.engine.drain()
    shown = world.invoke("runs", "show", run_id)
    assert shown.exit_code == 0, shown.output
    assert "published values" not in shown.stdout and "streams:" not in shown.stdout
    document = json.loads(world.invoke("runs", "show", run_id, "--json").stdout)
    assert document["published"] == {} and document["streams"] == []
