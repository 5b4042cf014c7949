"""`dex queues list|pause|resume|capacity`."""

from __future__ import annotations

import json

import pytest

import dex
from tests.cli.conftest import World, one_line_error, order

pytestmark = pytest.mark.postgres


def queue_states(world: World) -> dict[tuple[str, str], tuple[str, int]]:
    return {(q.name, q.kind): (q.status, q.capacity) for q in world.engine.list_queues()}


def test_list_shows_each_queue_with_status_capacity_and_depth(world: World) -> None:
    world.engine.create_queue("payments", "activity", capacity=7)
    world.engine.start_workflow(order, "dan")  # one workflow task waits in "default"
    world.engine.workflow_scheduler.step()
    result = world.invoke("queues", "list")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "NAME      KIND      STATUS  CAPACITY  DEPTH",
        "default   activity  ACTIVE  100       0",
        "default   workflow  ACTIVE  100       1",
        "payments  activity  ACTIVE  7         0",
    ]
    as_json = json.loads(world.invoke("queues", "list", "--json").stdout)
    assert as_json[2] == {"name": "payments", "kind": "activity", "status": "ACTIVE", "capacity": 7, "depth": 0}


def test_pause_and_resume_act_on_every_kind_of_that_name_unless_told(world: World) -> None:
    paused = world.invoke("queues", "pause", "default")
    assert paused.exit_code == 0, paused.output
    assert paused.stdout.splitlines() == [
        "paused activity queue 'default' (status PAUSED, capacity 100)",
        "paused workflow queue 'default' (status PAUSED, capacity 100)",
    ]
    assert queue_states(world) == {("default", "activity"): ("PAUSED", 100), ("default", "workflow"): ("PAUSED", 100)}

    resumed = world.invoke("queues", "resume", "default", "--kind", "workflow", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout) == [
        {"name": "default", "kind": "workflow", "status": "ACTIVE", "capacity": 100, "depth": 0}
    ]
    assert queue_states(world)[("default", "activity")] == ("PAUSED", 100)


def test_a_paused_queue_holds_its_runs_back(world: World) -> None:
    assert world.invoke("queues", "pause", "default", "--kind", "workflow").exit_code == 0
    run_id = world.engine.start_workflow(order, "eve")
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.CREATED
    assert world.invoke("queues", "resume", "default").exit_code == 0
    world.engine.drain()
    assert world.engine.get_run(run_id).status is dex.RunStatus.RUNNING


def test_capacity_sets_the_limit(world: World) -> None:
    result = world.invoke("queues", "capacity", "default", "3", "--kind", "activity")
    assert result.exit_code == 0, result.output
    assert result.stdout == "set capacity 3 of activity queue 'default' (status ACTIVE, capacity 3)\n"
    assert queue_states(world) == {("default", "activity"): ("ACTIVE", 3), ("default", "workflow"): ("ACTIVE", 100)}


@pytest.mark.parametrize(
    ("command", "code", "message"),
    [
        (["queues", "pause", "Payments!"], 2, "error: Invalid value for 'NAME': invalid queue name 'Payments!'"),
        (["queues", "resume", "nope"], 1, "error: there is no queue named 'nope'"),
        (
            ["queues", "pause", "payments", "--kind", "activity"],
            1,
            "error: there is no activity queue named 'payments'",
        ),
        (
            ["queues", "capacity", "default", "0"],
            2,
            "error: Invalid value for 'CAPACITY': 0 is not in the range 1<=x<=2147483647",
        ),
        # a negative number is the argument it looks like, refused with the range, not "No such option '-3'"
        (
            ["queues", "capacity", "default", "-3"],
            2,
            "error: Invalid value for 'CAPACITY': -3 is not in the range 1<=x<=2147483647",
        ),
        (
            ["queues", "capacity", "--kind", "activity", "default", "-1", "--json"],
            2,
            "error: Invalid value for 'CAPACITY': -1 is not in the range 1<=x<=2147483647",
        ),
        (["queues", "capacity", "default", "3", "--bogus"], 2, "error: No such option '--bogus'"),
        (
            ["queues", "capacity", "default", "many"],
            2,
            "error: Invalid value for 'CAPACITY': 'many' is not a valid integer",
        ),
        (["queues", "pause", "default", "--kind", "both"], 2, "error: Invalid value for '--kind'"),
    ],
)
def test_queue_errors(world: World, command: list[str], code: int, message: str) -> None:
    result = world.invoke(*command)
    assert result.exit_code == code
    assert one_line_error(result).startswith(message)
    assert queue_states(world) == {("default", "activity"): ("ACTIVE", 100), ("default", "workflow"): ("ACTIVE", 100)}
