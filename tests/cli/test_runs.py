"""`dex runs list` and `dex runs show`: tables, filters, the timeline and their JSON."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import Runs, one_line_error

pytestmark = pytest.mark.postgres


def listed(result_stdout: str) -> list[str]:
    """The run ids of a `runs list` table, top to bottom."""
    return [line.split()[0] for line in result_stdout.splitlines()[1:]]


def test_list_shows_every_run_newest_first_in_a_table(runs: Runs) -> None:
    result = runs.world.invoke("runs", "list")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["RUN", "ID", "WORKFLOW", "STATUS", "CREATED", "TOOK", "LABELS", "CUSTOM", "STATUS"]
    assert listed(result.stdout) == [runs.failed, runs.bob_child, runs.bob, runs.child, runs.ann]
    by_id = {row.split()[0]: row for row in rows}
    assert by_id[runs.ann].split()[1:4] == ["cli-order", "COMPLETED", "2025-03-01T09:00:00Z"]
    assert "env=prod,team=a" in by_id[runs.ann] and by_id[runs.ann].rstrip().endswith("packed")
    assert by_id[runs.bob].split()[1:3] == ["cli-order", "RUNNING"]
    assert by_id[runs.failed].split()[1:3] == ["cli-failing", "FAILED"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--workflow", "cli-order"], ["bob", "ann"]),
        (["--status", "failed"], ["failed"]),
        (["--status", "RUNNING", "--status", "completed"], ["bob_child", "bob", "child", "ann"]),
        (["--label", "team=a"], ["ann"]),
        (["--label", "team=a", "--label", "env=prod"], ["ann"]),
        (
            ["--created-after", "2025-03-01T09:30:00Z", "--created-before", "2025-03-01T10:30:00+00:00"],
            ["bob_child", "bob"],
        ),
        (["--created-after", "2025-03-01T10:30"], ["failed"]),  # naive times are UTC
        (["--limit", "2"], ["failed", "bob_child"]),
    ],
)
def test_list_filters(runs: Runs, options: list[str], expected: list[str]) -> None:
    result = runs.world.invoke("runs", "list", *options)
    assert result.exit_code == 0, result.output
    assert listed(result.stdout) == [getattr(runs, name) for name in expected]


def test_list_with_no_match_says_so_on_stderr(runs: Runs) -> None:
    result = runs.world.invoke("runs", "list", "--label", "team=a", "--label", "env=dev")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == "no runs match\n"
    as_json = runs.world.invoke("runs", "list", "--label", "team=nobody", "--json")
    assert json.loads(as_json.stdout) == []


def test_list_json_has_the_run_fields_and_decoded_results(runs: Runs) -> None:
    result = runs.world.invoke("runs", "list", "--workflow", "cli-order", "--json")
    assert result.exit_code == 0, result.output
    bob, ann = json.loads(result.stdout)
    assert ann["run_id"] == runs.ann
    assert ann["status"] == "COMPLETED"
    assert ann["labels"] == {"env": "prod", "team": "a"}
    assert ann["custom_status"] == "packed"
    assert ann["created_at"] == "2025-03-01T09:00:00Z"
    assert ann["result"] == {"greeting": "hello ann", "doubled": 42, "packed": {"by": "warehouse-7"}}
    assert ann["failure"] is None
    assert bob["status"] == "RUNNING" and bob["completed_at"] is None and bob["result"] is None
    # the group's --json works as well as the command's
    assert json.loads(runs.world.invoke("--json", "runs", "list", "--workflow", "cli-order").stdout) == [bob, ann]


def test_show_a_completed_run_gives_metadata_result_and_timeline(runs: Runs) -> None:
    result = runs.world.invoke("runs", "show", runs.ann)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert f"run              {runs.ann}\n" in text
    assert "status           COMPLETED  (packed)\n" in text
    assert "labels           env=prod,team=a\n" in text
    assert 'input            ("ann")\n' in text
    assert 'result           {"greeting": "hello ann", "doubled": 42, "packed": {"by": "warehouse-7"}}\n' in text
    timeline = text.split("\nhistory: ", 1)[1].splitlines()
    assert timeline[0].endswith("(workflow tasks hidden; --all shows them)")
    kinds = [line.split()[3] for line in timeline[1:]]
    assert kinds == [
        "RunCreated",
        "RunStarted",
        "ActivityTaskCreated",
        "ActivityTaskCompleted",
        "TimerCreated",
        "TimerElapsed",
        "ChildRunCreated",
        "ChildRunCompleted",
        "ExternalEventReceived",
        "RunCompleted",
    ]
    lines = dict(zip(kinds, timeline[1:], strict=True))
    assert lines["RunCreated"].split()[1:] == [
        "09:00:00.000",
        "+0ms",
        "RunCreated",
        'cli-order("ann")',
        "on",
        "queue",
        "default",
    ]
    assert lines["ActivityTaskCreated"].endswith('cli-greet("ann") on queue default')
    assert lines["ActivityTaskCompleted"].endswith('#4 cli-greet -> "hello ann"')
    assert "fires at 2025-03-01T09:05:00.000Z (after 5m00s)" in lines["TimerCreated"]
    assert lines["TimerElapsed"].split()[2] == "+5m00s"
    assert lines["ChildRunCreated"].endswith(f"cli-child(21) as run {runs.child}")
    assert lines["ChildRunCompleted"].endswith(f"run {runs.child} -> 42")
    assert lines["ExternalEventReceived"].endswith('packed: {"by": "warehouse-7"}')
    assert lines["RunCompleted"].endswith(
        'COMPLETED -> {"greeting": "hello ann", "doubled": 42, "packed": {"by": "warehouse-7"}}'
    )

    everything = runs.world.invoke("runs", "show", runs.ann, "--all").stdout
    assert "WorkflowTaskStarted" in everything and "WorkflowTaskCompleted" in everything


def test_show_a_failed_run_gives_the_failure_and_on_request_its_stack(runs: Runs) -> None:
    result = runs.world.invoke("runs", "show", runs.failed)
    assert result.exit_code == 0, result.output
    assert "failure          ActivityFailedError: activity 'cli-explode' failed: ValueError: boom 7" in result.stdout
    assert "ActivityTaskFailed     #4 cli-explode: ValueError: boom 7" in result.stdout
    assert "Traceback" not in result.stdout
    with_stack = runs.world.invoke("runs", "show", runs.failed, "--stack").stdout
    assert "Traceback (most recent call last)" in with_stack
    assert "Caused by:" in with_stack and 'raise ValueError(f"boom {code}")' in with_stack


def test_show_json_has_the_run_and_its_decoded_history(runs: Runs) -> None:
    result = runs.world.invoke("runs", "show", runs.ann, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["run_id"] == runs.ann and document["status"] == "COMPLETED"
    history = document["history"]
    assert [item["sequence_number"] for item in history] == list(range(1, len(history) + 1))
    assert history[0]["kind"] == "RunCreated"
    assert history[0]["timestamp"] == "2025-03-01T09:00:00Z"
    assert history[0]["event"]["input"] == ["ann"]
    assert history[0]["event"]["labels"] == {"env": "prod", "team": "a"}
    created = next(item["event"] for item in history if item["kind"] == "ActivityTaskCreated")
    assert created["name"] == "cli-greet" and created["input"] == ["ann"]
    assert created["retry_policy"]["max_attempts"] == 6 and created["retry_policy"]["initial_delay"] == 5.0
    completed = history[-2]["event"] if history[-1]["kind"] != "RunCompleted" else history[-1]["event"]
    assert completed["status"] == "COMPLETED"
    assert completed["result"]["doubled"] == 42


def test_show_an_unknown_run_is_a_one_line_error(runs: Runs) -> None:
    result = runs.world.invoke("runs", "show", "00000000-0000-4000-8000-000000000000")
    assert result.exit_code == 1
    assert one_line_error(result) == "error: no run with id '00000000-0000-4000-8000-000000000000'"


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        (["--status", "sleeping"], "Invalid value for '--status'"),
        (["--label", "team"], "'team' is not KEY=VALUE"),
        (["--created-after", "yesterday"], "'yesterday' is neither an ISO 8601 time"),
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_list_usage_errors_exit_2_in_one_line(runs: Runs, options: list[str], complaint: str) -> None:
    result = runs.world.invoke("runs", "list", *options)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert complaint in line and line.endswith("(see 'dex runs list --help')")
