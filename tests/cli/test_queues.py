"""`dex queues list|pause|resume|capacity|key-concurrency|rate-limit`."""

from __future__ import annotations

import json
from datetime import timedelta

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
        "NAME      KIND      STATUS  CAPACITY  DEPTH  KEYS  RATE",
        "default   activity  ACTIVE  100       0      1     -",
        "default   workflow  ACTIVE  100       1      1     -",
        "payments  activity  ACTIVE  7         0      1     -",
    ]
    as_json = json.loads(world.invoke("queues", "list", "--json").stdout)
    assert as_json[2] == {
        "name": "payments",
        "kind": "activity",
        "status": "ACTIVE",
        "capacity": 7,
        "depth": 0,
        "key_concurrency": 1,
        "rate_limit": None,
    }


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
        {
            "name": "default",
            "kind": "workflow",
            "status": "ACTIVE",
            "capacity": 100,
            "depth": 0,
            "key_concurrency": 1,
            "rate_limit": None,
        }
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


def test_key_concurrency_and_rate_limit_are_set_and_listed(world: World) -> None:
    keys = world.invoke("queues", "key-concurrency", "default", "3", "--kind", "workflow")
    assert keys.exit_code == 0, keys.output
    assert keys.stdout == (
        "set key concurrency 3 of workflow queue 'default' (status ACTIVE, capacity 100, key concurrency 3)\n"
    )
    rate = world.invoke("queues", "rate-limit", "default", "600/5m", "--kind", "activity")
    assert rate.exit_code == 0, rate.output
    assert rate.stdout == (
        "set rate limit 600/5m of activity queue 'default' (status ACTIVE, capacity 100, rate limit 600/5m)\n"
    )
    assert world.invoke("queues", "list").stdout.splitlines() == [
        "NAME     KIND      STATUS  CAPACITY  DEPTH  KEYS  RATE",
        "default  activity  ACTIVE  100       0      1     600/5m",
        "default  workflow  ACTIVE  100       0      3     -",
    ]
    as_json = json.loads(world.invoke("queues", "rate-limit", "default", "1/250ms", "--json").stdout)
    assert [q["rate_limit"] for q in as_json] == [{"starts": 1, "period": 0.25}] * 2
    infos = {(q.name, q.kind): q for q in world.engine.list_queues()}
    assert infos[("default", "workflow")].rate_limit == (1, timedelta(milliseconds=250))
    removed = world.invoke("queues", "rate-limit", "default", "none")
    assert removed.exit_code == 0, removed.output
    assert (
        removed.stdout.splitlines()[0]
        == "removed the rate limit of activity queue 'default' (status ACTIVE, capacity 100)"
    )
    assert all(q.rate_limit is None for q in world.engine.list_queues())


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["queues", "key-concurrency", "default", "0"], "error: Invalid value for 'N': 0 is not in the range"),
        (["queues", "key-concurrency", "default", "-2"], "error: Invalid value for 'N': -2 is not in the range"),
        (["queues", "key-concurrency", "default", "two"], "error: Invalid value for 'N': 'two' is not a valid integer"),
        (["queues", "rate-limit", "default", "10"], "error: Invalid value for 'RATE': '10' is not a rate such as"),
        (["queues", "rate-limit", "default", "0/s"], "error: Invalid value for 'RATE': a rate limit's count must be"),
        (["queues", "rate-limit", "default", "1/0s"], "error: Invalid value for 'RATE': a rate limit's period must be"),
        (["queues", "rate-limit", "default", "1/400d"], "error: Invalid value for 'RATE': a rate limit's period must"),
        (["queues", "rate-limit", "default", "1/999999999d"], "error: Invalid value for 'RATE':"),
        (["queues", "rate-limit", "default", "5/s\x00"], "error: Invalid value for 'RATE':"),
        (["queues", "rate-limit", "tenants\x00", "5/s"], "error: Invalid value for 'NAME':"),
    ],
)
def test_limit_errors_change_nothing(world: World, command: list[str], message: str) -> None:
    result = world.invoke(*command)
    assert result.exit_code == 2
    assert one_line_error(result).startswith(message)
    assert {(q.key_concurrency, q.rate_limit) for q in world.engine.list_queues()} == {(1, None)}


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
