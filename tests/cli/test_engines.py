"""`dex engines`: the live engines on a schema, as a table or JSON."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.cli.conftest import ACTIVITIES, WORKFLOWS, World, one_line_error

pytestmark = pytest.mark.postgres


@pytest.fixture
def live(world: World) -> Iterator[dex.Engine]:
    """An engine started over the world's schema, on the system clock (the command's)."""
    adapter = PostgresAdapter(world.dsn, schema=world.schema, max_connections=6)
    engine = dex.Engine(adapter, WORKFLOWS, ACTIVITIES, node_id="cli-node-1", code_version="build-7")
    engine.start()
    try:
        yield engine
    finally:
        engine.stop(timeout=5)
        adapter.close()


def test_the_table_shows_each_live_engine(world: World, live: dex.Engine) -> None:
    (before,) = live.list_engines()
    result = world.invoke("engines")
    (after,) = live.list_engines()
    assert result.exit_code == 0, result.output
    header, line = (re.split(r"\s{2,}", text.strip()) for text in result.stdout.splitlines())
    assert header == ["NODE ID", "HOST", "PID", "CODE VERSION", "QUEUES", "WORKFLOWS", "ACTIVITIES", "LAST SEEN"]
    assert line[:7] == ["cli-node-1", socket.gethostname(), str(os.getpid()), "build-7", "default", "3", "2"]
    # a heartbeat may come between the reads
    assert line[7] in {info.last_seen.strftime("%Y-%m-%dT%H:%M:%SZ") for info in (before, after)}


def test_json_lists_every_field(world: World, live: dex.Engine) -> None:
    result = world.invoke("engines", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert set(row) == {
        "node_id",
        "host",
        "pid",
        "code_version",
        "workflows",
        "activities",
        "queues",
        "started_at",
        "last_seen",
    }
    assert (row["node_id"], row["pid"], row["code_version"]) == ("cli-node-1", os.getpid(), "build-7")
    assert row["workflows"] == ["cli-child", "cli-failing", "cli-order"]
    assert row["activities"] == ["cli-explode", "cli-greet"]
    assert row["queues"] == ["default"]


def test_a_stopped_engine_is_not_listed(world: World, live: dex.Engine) -> None:
    live.stop(timeout=5)
    result = world.invoke("engines")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "no live engines" in result.stderr
    assert json.loads(world.invoke("engines", "--json").stdout) == []


def test_runs_start_refuses_a_workflow_no_live_engine_registers(world: World) -> None:
    refused = world.invoke("runs", "start", "cli-child", "--args", "[21]")
    assert refused.exit_code == 1
    assert one_line_error(refused).startswith("error: no live engine registers the workflow 'cli-child'")
    assert world.engine.list_runs() == []  # nothing was made
    forced = world.invoke("runs", "start", "cli-child", "--args", "[21]", "--force", "--json")
    assert forced.exit_code == 0, forced.output
    run_id = json.loads(forced.stdout)["run_id"]
    assert world.engine.get_run(run_id).status is dex.RunStatus.CREATED  # it waits for an engine with its code
    world.engine.drain()
    assert world.engine.wait(run_id, timeout=1) == 42


def test_runs_start_makes_the_run_a_live_engine_runs(world: World, live: dex.Engine) -> None:
    started = world.invoke("runs", "start", "cli-child", "--args", "[4]", "--label", "via=cli", "--instance-id", "c-1")
    assert started.exit_code == 0, started.output
    assert started.stdout.startswith("started run ") and started.stdout.endswith(" of 'cli-child'\n")
    run_id = started.stdout.split()[2]
    assert live.wait(run_id, timeout=10) == 8
    info = live.get_run(run_id)
    assert (info.labels, info.instance_id) == ({"via": "cli"}, "c-1")
    unknown = world.invoke("runs", "start", "cli-nobody")
    assert unknown.exit_code == 1 and "'cli-nobody'" in one_line_error(unknown)


def test_runs_start_takes_only_a_json_array_of_arguments(world: World) -> None:
    for bad in ('{"n": 1}', "7", "[1,"):
        result = world.invoke("runs", "start", "cli-child", "--args", bad, "--force")
        assert result.exit_code == 2, (bad, result.output)
        assert "--args" in one_line_error(result) or "JSON" in one_line_error(result)
    assert world.engine.list_runs() == []
