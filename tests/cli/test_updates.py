"""`dex runs update` and `dex runs query` against a running engine (docs/cli/runs-update.md,
docs/cli/runs-query.md): answers, errors as one line with their exit codes, and poison."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.cli.conftest import World, one_line_error
from tests.cli.update_app import cli_cart

pytestmark = pytest.mark.postgres

APP = "tests.cli.update_app:make_engine"


@pytest.fixture
def served(world: World) -> Iterator[tuple[World, str]]:
    """A cart run, and an engine with its code started over the world's schema (it answers the
    updates). On the wall clock, as the command line's messages are: the world's virtual clock
    stands in the past, where those would never be due."""
    adapter = PostgresAdapter(world.dsn, schema=world.schema, max_connections=4)
    engine = dex.Engine(adapter, workflows=[cli_cart], poll_interval=0.2)
    run_id = engine.start_workflow(cli_cart)
    try:
        with engine:
            yield world, run_id
    finally:
        adapter.close()


def test_update_prints_the_answer_and_query_reads_the_state(served: tuple[World, str]) -> None:
    world, run_id = served
    env = {"DEX_TEST_CLI_SCHEMA": world.schema}
    sent = world.invoke("runs", "update", run_id, "add", '["lamp"]', "--update-id", "u1")
    assert (sent.exit_code, sent.stdout.strip()) == (0, "1"), sent.output
    again = world.invoke("runs", "update", run_id, "add", '["other"]', "--update-id", "u1")
    assert again.stdout.strip() == "1"  # the recorded answer: the handler ran once
    as_json = world.invoke("--json", "runs", "update", run_id, "add", "-", input='["desk"]')
    assert json.loads(as_json.stdout) == {"run_id": run_id, "name": "add", "result": 2}, as_json.output
    asked = world.invoke("runs", "query", run_id, "items", '["#"]', "--app", APP, env=env)
    assert (asked.exit_code, json.loads(asked.stdout)) == (0, ["#lamp", "#desk"]), asked.output


def test_errors_are_one_line_with_their_exit_codes(served: tuple[World, str]) -> None:
    world, run_id = served
    env = {"DEX_TEST_CLI_SCHEMA": world.schema}
    cases = [
        (("runs", "update", run_id, "add", '[""]'), 1, "UpdateRejectedError: "),
        (("runs", "update", run_id, "remove", '["x"]'), 1, "no update handler named 'remove'"),
        (("runs", "update", run_id, "fail"), 1, "UpdateFailedError: "),
        (("runs", "update", run_id, "add", '{"a": 1}'), 2, "must be a JSON array"),
        (("runs", "update", run_id, "add", "[nope"), 2, "not valid JSON"),
        (("runs", "update", "no-such-run", "add", '["x"]'), 1, "no run with id"),
        (("runs", "query", run_id, "items"), 1, "pass --app MODULE:ENGINE"),
        (("runs", "query", run_id, "missing", "--app", APP), 1, "QueryError: "),
    ]
    for args, code, shown in cases:
        result = world.invoke(*args, env=env)
        assert result.exit_code == code, (args, result.output)
        assert shown in one_line_error(result), (args, result.output)
    assert world.invoke("runs", "update", run_id, "add", '["ok"]').stdout.strip() == "1"  # healthy afterwards


@pytest.mark.parametrize("bad", ["\x00", "\ud800"])
def test_poison_in_names_and_ids_is_a_usage_error(served: tuple[World, str], bad: str) -> None:
    world, run_id = served
    for args in (
        ("runs", "update", run_id, f"add{bad}", '["x"]'),
        ("runs", "update", run_id, "add", '["x"]', "--update-id", f"u{bad}"),
        ("runs", "update", f"{run_id}{bad}", "add", '["x"]'),
    ):
        result = world.invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        one_line_error(result)
    assert world.invoke("runs", "update", run_id, "add", '["ok"]').stdout.strip() == "1"


def test_an_update_to_an_ended_run(served: tuple[World, str]) -> None:
    world, run_id = served
    assert world.invoke("runs", "update", run_id, "add", '["done"]').exit_code == 0
    reader = PostgresAdapter(world.dsn, schema=world.schema, max_connections=2)
    try:
        dex.Engine(reader).wait(run_id, timeout=20)
    finally:
        reader.close()
    ended = world.invoke("runs", "update", run_id, "add", '["late"]')
    assert ended.exit_code == 1 and "ended" in one_line_error(ended)
