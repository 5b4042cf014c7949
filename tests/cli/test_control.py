"""`dex runs cancel|suspend|resume` and `dex events send`: what they change and how they refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dex
from tests.cli.conftest import World, one_line_error, order

pytestmark = pytest.mark.postgres

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def waiting_run(world: World) -> str:
    """A cli-order run that waits for its "packed" event."""
    run_id = world.engine.start_workflow(order, "cat")
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.RUNNING
    return run_id


def test_suspend_and_resume_change_the_status_at_once(world: World) -> None:
    run_id = waiting_run(world)
    suspended = world.invoke("runs", "suspend", run_id)
    assert suspended.exit_code == 0, suspended.output
    assert suspended.stdout == f"suspended run {run_id} (status now SUSPENDED)\n"
    assert world.engine.get_run(run_id).status is dex.RunStatus.SUSPENDED

    again = world.invoke("runs", "suspend", run_id)
    assert again.exit_code == 1
    assert one_line_error(again) == f"error: cannot suspend run {run_id}: a run cannot go from SUSPENDED to SUSPENDED"

    resumed = world.invoke("runs", "resume", run_id, "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["status"] == "RUNNING"
    world.engine.drain()
    kinds = [item.kind for item in world.engine.history(run_id)]
    assert kinds.count("RunSuspended") == 1 and kinds.count("RunResumed") == 1


def test_cancel_is_a_request_that_the_next_workflow_task_carries_out(world: World) -> None:
    run_id = waiting_run(world)
    result = world.invoke("runs", "cancel", run_id, "--reason", "customer called")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"cancellation of run {run_id} requested (status now RUNNING)\n"
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.CANCELLED
    shown = world.invoke("runs", "show", run_id).stdout
    assert "RunCancelled           reason: customer called" in shown
    assert "RunCompleted           CANCELLED" in shown

    again = world.invoke("runs", "cancel", run_id)
    assert again.exit_code == 1
    assert one_line_error(again) == f"error: cannot cancel: run {run_id} has ended (CANCELLED)"


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "cancel", UNKNOWN],
        ["runs", "suspend", UNKNOWN],
        ["runs", "resume", UNKNOWN],
        ["events", "send", UNKNOWN, "packed", "--json", "1"],
    ],
)
def test_an_unknown_run_id_is_a_one_line_error(world: World, command: list[str]) -> None:
    result = world.invoke(*command)
    assert result.exit_code == 1
    assert one_line_error(result) == f"error: no run with id '{UNKNOWN}'"


def test_send_an_event_with_a_json_payload(world: World) -> None:
    run_id = waiting_run(world)
    result = world.invoke("events", "send", run_id, "packed", "--json", '{"by": "warehouse-7", "boxes": 2}')
    assert result.exit_code == 0, result.output
    assert result.stdout == f"sent event 'packed' to run {run_id}\n"
    world.engine.drain()
    assert world.engine.wait(run_id, timeout=5)["packed"] == {"by": "warehouse-7", "boxes": 2}


@pytest.mark.parametrize("source", ["file", "stdin", "none"])
def test_the_payload_may_come_from_a_file_or_stdin_or_be_null(world: World, tmp_path: Path, source: str) -> None:
    run_id = waiting_run(world)
    payload = tmp_path / "payload.json"
    payload.write_text('["a", 1]')
    options = {"file": ["--json", f"@{payload}"], "stdin": ["--json", "-"], "none": []}[source]
    result = world.invoke("--json", "events", "send", run_id, "packed", *options, input='["a", 1]')
    assert result.exit_code == 0, result.output
    expected = None if source == "none" else ["a", 1]
    assert json.loads(result.stdout) == {"run_id": run_id, "event_id": "packed", "payload": expected}
    world.engine.drain()
    assert world.engine.wait(run_id, timeout=5)["packed"] == expected


def test_a_bad_payload_or_event_id_is_a_usage_error_and_sends_nothing(world: World, tmp_path: Path) -> None:
    run_id = waiting_run(world)
    bad_json = world.invoke("events", "send", run_id, "packed", "--json", "{by: 7}")
    assert bad_json.exit_code == 2
    assert "error: Invalid value for '--json': the payload is not valid JSON" in one_line_error(bad_json)
    missing = world.invoke("events", "send", run_id, "packed", "--json", f"@{tmp_path / 'nope.json'}")
    assert missing.exit_code == 2
    assert "cannot read" in one_line_error(missing)
    bad_id = world.invoke("events", "send", run_id, "no spaces", "--json", "1")
    assert bad_id.exit_code == 2
    assert "invalid event id 'no spaces'" in one_line_error(bad_id)
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.RUNNING  # nothing arrived


def test_an_event_for_an_ended_run_is_refused(world: World) -> None:
    run_id = waiting_run(world)
    world.engine.cancel(run_id)
    world.engine.drain()
    result = world.invoke("events", "send", run_id, "packed")
    assert result.exit_code == 1
    assert one_line_error(result) == f"error: cannot send event 'packed': run {run_id} has ended (CANCELLED)"


def test_cancel_with_filters_lists_the_runs_asks_and_cancels_only_those(world: World) -> None:
    picked = [world.engine.start_workflow(order, name, labels={"team": "a"}) for name in ("ann", "bob")]
    spared = world.engine.start_workflow(order, "cy", labels={"team": "b"})
    world.engine.drain()
    declined = world.invoke("runs", "cancel", "--label", "team=a", input="n\n")
    assert declined.exit_code == 1
    assert all(run_id in declined.stderr for run_id in picked) and spared not in declined.stderr
    assert "cancel these 2 run(s)?" in declined.stderr and "error: nothing cancelled" in declined.stderr
    world.engine.drain()
    assert {world.engine.get_run(r).status for r in [*picked, spared]} == {dex.RunStatus.RUNNING}

    accepted = world.invoke("runs", "cancel", "--label", "team=a", "--reason", "bulk", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert accepted.stdout == "cancellation requested for 2 of 2 run(s)\n"
    world.engine.drain()
    assert [world.engine.get_run(r).status for r in picked] == [dex.RunStatus.CANCELLED] * 2
    assert world.engine.get_run(spared).status is dex.RunStatus.RUNNING

    # --yes asks nothing; finished runs are never selected, so none is left to cancel
    skipped = world.invoke("runs", "cancel", "--workflow", "cli-order", "--yes", "--json")
    assert skipped.exit_code == 0, skipped.output
    assert json.loads(skipped.stdout) == {"requested": [spared], "refused": []}
    world.engine.drain()
    assert world.engine.get_run(spared).status is dex.RunStatus.CANCELLED
    again = world.invoke("runs", "cancel", "--workflow", "cli-order", "--status", "running", "--yes")
    assert again.exit_code == 1
    assert one_line_error(again) == "error: no live run matches: nothing to cancel"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["runs", "cancel"], "give a RUN_ID, or filters"),
        (["runs", "cancel", UNKNOWN, "--workflow", "cli-order"], "give a RUN_ID or filters, not both"),
        (["runs", "cancel", "--label", "bad\x00=x", "--yes"], "label"),
    ],
)
def test_cancel_usage_errors_exit_2_in_one_line(world: World, args: list[str], complaint: str) -> None:
    healthy = waiting_run(world)
    result = world.invoke(*args)
    assert result.exit_code == 2
    assert complaint in one_line_error(result)
    assert world.engine.get_run(healthy).status is dex.RunStatus.RUNNING
