"""``dex runs start --id-reuse/--debounce/--debounce-max`` (docs/reference/contract.md §15)."""

from __future__ import annotations

import json

import dex
from tests.cli.conftest import World, child, one_line_error


def test_id_reuse_never_prints_the_ended_runs_id(world: World) -> None:
    ended = world.engine.start_workflow(child, 1, instance_id="cli-key")
    world.engine.drain()
    assert world.engine.get_run(ended).status is dex.RunStatus.COMPLETED
    again = world.invoke(
        "runs",
        "start",
        "cli-child",
        "--args",
        "[2]",
        "--instance-id",
        "cli-key",
        "--id-reuse",
        "never",
        "--force",
        "--json",
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["run_id"] == ended
    fresh = world.invoke("runs", "start", "cli-child", "--args", "[2]", "--instance-id", "cli-key", "--force", "--json")
    assert json.loads(fresh.stdout)["run_id"] != ended
    assert len(world.engine.list_runs(instance_id="cli-key")) == 2


def test_debounced_starts_replace_the_arguments_of_the_waiting_run(world: World) -> None:
    line = ("runs", "start", "cli-child", "--instance-id", "cli-debounced", "--debounce", "3600", "--force", "--json")
    first = world.invoke(*line, "--args", "[1]")
    second = world.invoke(*line, "--args", "[5]", "--debounce-max", "7200")
    assert first.exit_code == second.exit_code == 0, (first.output, second.output)
    run_id = json.loads(first.stdout)["run_id"]
    assert json.loads(second.stdout)["run_id"] == run_id
    created = world.engine.history(run_id)[0].event
    assert [payload.data for payload in created.input] == [b"5"]  # the second start's argument
    assert world.engine.get_run(run_id).status is dex.RunStatus.CREATED
    assert len(world.engine.list_runs(instance_id="cli-debounced")) == 1


def test_bad_rules_are_exit_code_2_and_make_nothing(world: World) -> None:
    for extra in (
        ("--id-reuse", "sometimes"),
        ("--id-reuse", "never"),  # without --instance-id
        ("--debounce", "-1", "--instance-id", "k"),
        ("--debounce", "nan", "--instance-id", "k"),
        ("--debounce", "5"),  # without --instance-id
        ("--debounce-max", "5", "--instance-id", "k"),  # without --debounce
    ):
        result = world.invoke("runs", "start", "cli-child", "--args", "[1]", "--force", *extra)
        assert result.exit_code == 2, (extra, result.output)
        assert one_line_error(result)
    assert world.engine.list_runs(instance_id="k") == []
    healthy = world.invoke(
        "runs", "start", "cli-child", "--args", "[1]", "--force", "--instance-id", "k", "--id-reuse", "never"
    )
    assert healthy.exit_code == 0, healthy.output


def test_schedules_show_tells_the_id_reuse(world: World) -> None:
    world.engine.create_schedule(dex.Schedule("keyed", child, cron="0 3 * * *", args=(1,), id_reuse="never"))
    shown = world.invoke("schedules", "show", "keyed")
    assert shown.exit_code == 0, shown.output
    assert "id reuse:        never\n" in shown.stdout
    assert json.loads(world.invoke("schedules", "show", "keyed", "--json").stdout)["id_reuse"] == "never"
