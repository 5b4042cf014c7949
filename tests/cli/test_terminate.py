"""`dex runs terminate` and what `dex runs show` says of how a run ended (docs/reference/contract.md §14)."""

from __future__ import annotations

import json

import pytest

import dex
from tests.cli.conftest import World, one_line_error, order

pytestmark = pytest.mark.postgres

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def test_terminate_ends_the_run_when_the_command_returns(world: World) -> None:
    run_id = world.engine.start_workflow(order, "cat")
    world.engine.drain()
    result = world.invoke("runs", "terminate", run_id, "--reason", "stuck after a deploy")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"run {run_id} terminated (status now TERMINATED)\n"
    assert world.engine.get_run(run_id).status is dex.RunStatus.TERMINATED  # no worker needed
    shown = world.invoke("runs", "show", run_id).stdout
    assert "RunTerminated" in shown and "stuck after a deploy" in shown
    assert "RunCompleted           TERMINATED" in shown

    again = world.invoke("runs", "terminate", run_id)
    assert again.exit_code == 1
    assert one_line_error(again) == f"error: cannot terminate: run {run_id} has ended (TERMINATED)"


def test_terminate_json_and_refusals(world: World) -> None:
    run_id = world.engine.start_workflow(order, "dog")
    unknown = world.invoke("runs", "terminate", UNKNOWN)
    assert unknown.exit_code == 1
    assert one_line_error(unknown) == f"error: no run with id '{UNKNOWN}'"
    bad = world.invoke("runs", "terminate", run_id, "--reason", "nul\x00")
    assert bad.exit_code == 2
    assert world.engine.get_run(run_id).status is dex.RunStatus.CREATED
    done = world.invoke("runs", "terminate", run_id, "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["status"] == "TERMINATED"


def test_show_prints_the_deadline_and_the_unread_events(world: World) -> None:
    from datetime import timedelta

    run_id = world.engine.start_workflow(order, "eel", timeout=timedelta(hours=1))
    world.engine.send_event(run_id, "never-read", 1)
    world.engine.send_event(run_id, "packed", "box")
    world.engine.drain()  # the five minutes pass, the child answers, "packed" ends it
    assert world.engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    shown = world.invoke("runs", "show", run_id).stdout
    assert "deadline" in shown
    assert "unread events    1" in shown
    document = json.loads(world.invoke("runs", "show", run_id, "--json").stdout)
    assert document["deadline"] is not None and document["unread_events"] == 1
