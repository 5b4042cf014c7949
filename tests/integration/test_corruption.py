"""A history row that cannot be decoded holds its run (or, with on_nondeterminism="fail", fails it)
with a clear failure; the worker serves the rest."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.testing import VirtualClock
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres


@dex.workflow
async def waits(ctx: dex.WorkflowContext) -> Any:
    return await ctx.wait_for_event("go")


@pytest.mark.parametrize("on_nondeterminism", ["hold", "fail"])
def test_an_undecodable_history_row_holds_or_fails_only_its_run(on_nondeterminism: str) -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, clock=VirtualClock())
        try:
            first = dex.Engine(adapter, workflows=[waits])
            broken, healthy = first.start_workflow(waits), first.start_workflow(waits)
            first.drain()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "UPDATE {}.history SET events = %s WHERE run_id = %s AND 3 BETWEEN first_seq AND last_seq"
                    ).format(sql.Identifier(schema)),
                    [b"\xff\x00 not protobuf", broken],
                )
            # a fresh node: nothing cached
            second = dex.Engine(adapter, workflows=[waits], on_nondeterminism=on_nondeterminism)
            for run_id in (broken, healthy):
                second.send_event(run_id, "go", "ok")
            second.drain()
            assert second.wait(healthy, timeout=1) == "ok"
            info = second.get_run(broken)
            if (
                on_nondeterminism == "hold"
            ):  # code that reads it may come: the run waits (docs/reference/contract.md §11)
                assert info.status is dex.RunStatus.RUNNING and info.failure is None
                failure = info.task_failure
            else:
                assert info.status is dex.RunStatus.FAILED and info.task_failure is None
                failure = info.failure
            assert failure is not None and failure.type == "UnreadableHistoryError"
            assert f"the history of run {broken} cannot be read" in failure.message
        finally:
            adapter.close()
