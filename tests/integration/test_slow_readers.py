"""Sessions that read slowly or sit idle do not stall the queues."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter

pytestmark = pytest.mark.postgres


@dex.activity
def plus_one(x: int) -> int:
    return x + 1


@dex.workflow
async def two_steps(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(plus_one, x)
    return await ctx.activity(plus_one, x)  # type: ignore[no-any-return]


def test_a_long_reader_and_an_idle_snapshot_do_not_stall_the_queues(pg_dsn: str, pg_schema: str) -> None:
    adapter = PostgresAdapter(pg_dsn, schema=pg_schema)
    engine = dex.Engine(adapter, workflows=[two_steps], activities=[plus_one], poll_interval=0.01)
    schema = sql.Identifier(pg_schema)
    reader_started = threading.Event()

    def slow_reader() -> None:
        # a report that scans every dex table inside one long REPEATABLE READ transaction
        with psycopg.connect(pg_dsn) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for table in ("runs", "history", "inbox", "workflow_tasks", "activity_tasks"):
                conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(schema, sql.Identifier(table)))
            reader_started.set()
            conn.execute("SELECT pg_sleep(6)")  # holds its snapshot and its table locks meanwhile

    idle: Any = psycopg.connect(pg_dsn)
    try:
        # an idle session in an open transaction that has read (and so share-locked) the tables
        idle.execute(sql.SQL("SELECT * FROM {}.runs LIMIT 1").format(schema))
        reader = threading.Thread(target=slow_reader)
        reader.start()
        assert reader_started.wait(10)
        with engine:
            run_ids = [engine.start_workflow(two_steps, i) for i in range(20)]
            results = [engine.wait(r, timeout=5) for r in run_ids]  # well before the reader ends
        assert results == [i + 2 for i in range(20)]
        assert reader.is_alive()  # the work finished while the reader was still reading
        reader.join()
    finally:
        idle.close()
        adapter.close()
