"""`dex runs fork` (docs/reference/contract.md §11): one run by id, or in bulk with the filters of `dex runs list`,
listing the runs and asking first (`--yes` skips the question)."""

from __future__ import annotations

import json

import pytest

import dex
from tests.cli.conftest import World, failing, one_line_error, order

pytestmark = pytest.mark.postgres

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def failed_run(world: World) -> str:
    run_id = world.engine.start_workflow(failing)
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.FAILED
    return run_id


def test_fork_of_one_run_prints_the_new_run_and_show_names_the_original(world: World) -> None:
    run_id = failed_run(world)
    result = world.invoke("runs", "fork", run_id)
    assert result.exit_code == 0, result.output
    forks = [info for info in world.engine.list_runs() if info.forked_from == run_id]
    assert len(forks) == 1
    fork_id = forks[0].run_id
    assert result.stdout == f"forked run {run_id} as run {fork_id}\n"
    shown = world.invoke("runs", "show", fork_id)
    assert shown.exit_code == 0, shown.output
    assert f"forked from {run_id}" in " ".join(shown.stdout.split())
    as_json = world.invoke("runs", "show", fork_id, "--json")
    assert json.loads(as_json.stdout)["forked_from"] == run_id
    assert json.loads(world.invoke("runs", "show", run_id, "--json").stdout)["forked_from"] is None
    world.engine.drain()  # the fork runs the (still broken) step again, and fails the same way
    assert world.engine.get_run(fork_id).status is dex.RunStatus.FAILED


def test_fork_at_a_point_and_on_a_queue_with_json_output(world: World) -> None:
    run_id = failed_run(world)
    result = world.invoke("runs", "fork", run_id, "--at", "1", "--queue", "repairs", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["forked_from"] == run_id and document["queue"] == "repairs" and document["status"] == "CREATED"
    assert [item.kind for item in world.engine.history(document["run_id"])] == ["RunCreated"]


def test_bulk_fork_lists_the_runs_asks_and_forks_only_those(world: World) -> None:
    picked = [failed_run(world) for _ in range(2)]
    spared = world.engine.start_workflow(order, "ann")
    world.engine.drain()
    declined = world.invoke("runs", "fork", "--workflow", "cli-failing", "--status", "failed", input="n\n")
    assert declined.exit_code == 1
    assert all(run_id in declined.stderr for run_id in picked) and spared not in declined.stderr
    assert "fork these 2 run(s)?" in declined.stderr and "error: nothing forked" in declined.stderr
    assert not [info for info in world.engine.list_runs() if info.forked_from is not None]

    accepted = world.invoke("runs", "fork", "--workflow", "cli-failing", "--status", "failed", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    forks = {info.forked_from: info.run_id for info in world.engine.list_runs() if info.forked_from is not None}
    assert set(forks) == set(picked)
    lines = accepted.stdout.splitlines()
    assert lines[-1] == "forked 2 of 2 run(s)"
    assert sorted(lines[:-1]) == sorted(f"forked run {run_id} as run {forks[run_id]}" for run_id in picked)

    # --yes asks nothing; the forks themselves are CREATED or RUNNING now, the filter skips them
    quiet = world.invoke("runs", "fork", "--workflow", "cli-failing", "--status", "failed", "--yes", "--json")
    assert quiet.exit_code == 0, quiet.output
    assert "?" not in quiet.stderr
    document = json.loads(quiet.stdout)
    assert sorted(entry["run_id"] for entry in document["forked"]) == sorted(picked)
    assert document["refused"] == []
    assert len([info for info in world.engine.list_runs() if info.forked_from is not None]) == 4
    assert world.engine.get_run(spared).status is dex.RunStatus.RUNNING


def test_bulk_fork_reports_the_runs_it_could_not_fork(world: World) -> None:
    held = world.engine.start_workflow(order, "bob", instance_id="order-bob")  # live: its fork would clash
    world.engine.drain()
    result = world.invoke("runs", "fork", "--instance-id", "order-bob", "--yes")
    assert result.exit_code == 1
    assert result.stdout == "forked 0 of 1 run(s)\n"
    assert f"not forked: cannot fork: instance id 'order-bob' is in use by run {held}" in result.stderr
    nothing = world.invoke("runs", "fork", "--workflow", "cli-nothing", "--yes")
    assert nothing.exit_code == 1
    assert one_line_error(nothing) == "error: no run matches: nothing to fork"


@pytest.mark.parametrize(
    ("args", "code", "complaint"),
    [
        (["runs", "fork"], 2, "give a RUN_ID, or filters"),
        (["runs", "fork", "RUN", "--workflow", "cli-failing"], 2, "give a RUN_ID or filters, not both"),
        (["runs", "fork", "--workflow", "cli-failing", "--at", "5"], 2, "--at names a point of one run's history"),
        (["runs", "fork", "RUN", "--at", "0"], 2, "Invalid value for '--at'"),
        (["runs", "fork", "RUN", "--at", "two"], 2, "Invalid value for '--at'"),
        (["runs", "fork", "RUN", "--at", "2"], 2, "at=2 is not the end of a workflow task"),
        (["runs", "fork", "RUN", "--at", "99"], 2, "beyond the history"),
        (["runs", "fork", "RUN", "--queue", "bad queue!"], 2, "invalid queue name"),
        (["runs", "fork", "RUN", "--queue", "q\x00"], 2, "NUL"),
        (["runs", "fork", "bad\x00id"], 2, "NUL"),
        (["runs", "fork", UNKNOWN], 1, f"no run with id '{UNKNOWN}'"),
    ],
)
def test_fork_refusals_are_one_line_and_write_nothing(world: World, args: list[str], code: int, complaint: str) -> None:
    run_id = failed_run(world)
    before = len(world.engine.list_runs())
    result = world.invoke(*[run_id if arg == "RUN" else arg for arg in args])
    assert result.exit_code == code, result.output
    assert complaint in one_line_error(result)
    assert len(world.engine.list_runs()) == before
