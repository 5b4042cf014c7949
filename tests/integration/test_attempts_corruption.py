"""A kept attempt whose failure cannot be decoded (a corrupted row, or one a newer dex wrote)
is shown as unreadable; the step's other attempts, and its run, are read as ever."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter

pytestmark = pytest.mark.postgres


@dex.activity(name="twice", retry=dex.RetryPolicy(initial_delay=timedelta(seconds=1), randomization_factor=0))
def twice() -> str:
    attempt = dex.activity_context().attempt
    if attempt <= 2:
        raise RuntimeError(f"failure {attempt}")
    return "ok"


@dex.workflow(name="calls-twice")
async def calls_twice(ctx: dex.WorkflowContext) -> Any:
    return await ctx.activity(twice)


def test_an_unreadable_kept_failure_is_said_so_and_hides_nothing_else(
    make_adapter: Any, pg_dsn: str, pg_schema: str
) -> None:
    adapter: PostgresAdapter = make_adapter()
    engine = dex.Engine(adapter, workflows=[calls_twice], activities=[twice])
    run_id = engine.start_workflow(calls_twice)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "ok"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        changed = conn.execute(
            sql.SQL("UPDATE {}.activity_attempts SET failures[2] = %s WHERE run_id = %s").format(
                sql.Identifier(pg_schema)
            ),
            [b"\xff\x00 not protobuf", run_id],
        )
        assert changed.rowcount == 1
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed) == ("completed", 3, 2)
    newest, oldest = step.recent
    assert (newest.attempt, newest.failure.message) == (2, "failure 2")
    assert (oldest.attempt, oldest.failure.type) == (1, "UnreadableFailure")
