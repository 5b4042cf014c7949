"""``dex runs show`` lists the activities a run waits for, so a task that no Python engine
registers (it waits for a remote worker, docs/reference/contract.md §13) is visible from the command line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.cli import cli
from dex.remote import ActivityTaskService
from tests.pg import fresh_schema, postgres_dsn
from tests.remote.support import one

pytestmark = pytest.mark.postgres


def test_runs_show_lists_a_task_waiting_for_a_remote_worker() -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema)
        try:
            engine = dex.Engine(adapter, workflows=[one])
            run_id = engine.start_workflow(one, "resize-image", {"w": 1})
            engine.drain()  # the engine runs the workflow task, and leaves the activity alone
            env = {"DEX_DATABASE_URL": dsn}
            shown = CliRunner().invoke(cli, ["--schema", schema, "runs", "show", run_id], env=env)
            assert shown.exit_code == 0, shown.output
            pending = [line for line in shown.stdout.splitlines() if line.startswith("pending")]
            assert len(pending) == 1 and pending[0].split()[1:] == ["#4", "resize-image"], shown.stdout
            as_json = CliRunner().invoke(cli, ["--schema", schema, "runs", "show", run_id, "--json"], env=env)
            assert json.loads(as_json.stdout)["pending_activities"] == [{"created_seq": 4, "name": "resize-image"}]
            service = ActivityTaskService(adapter)
            (task,) = service.poll("w", ["resize-image"], 1, 5)
            service.complete(task.task_id, task.lease_version, "done")
            engine.drain()
            shown = CliRunner().invoke(cli, ["--schema", schema, "runs", "show", run_id], env=env)
            assert "COMPLETED" in shown.stdout and "\npending" not in shown.stdout
        finally:
            adapter.close()
