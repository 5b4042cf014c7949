"""Transaction steps: 3-step workflows whose every step inserts a row, dex vs DBOS Transact.

``python -m benchmarks.transactions dex --schema S --runs N [--async-steps]`` (and ``dbos``) with the DSN in
``DEX_BENCH_DSN``; prints one JSON line. Each side runs in a process of its own (DBOS keeps
process-global state) and writes into a table ``S.bench_rows`` without constraints:

* dex: ``@dex.transaction`` steps (read committed) in a started ``Engine``; the workflows are
  started with ``start_workflow`` and waited for with ``wait``.
* DBOS: ``SQLAlchemyDatasource.transaction`` steps (DBOS 3's form of ``@DBOS.transaction``: the
  step's SQL and its checkpoint commit in one transaction), isolation READ COMMITTED as dex's,
  in a workflow enqueued on a queue with ``worker_concurrency=64`` and 10 ms polling, waited
  for with ``get_result`` polling every 10 ms (as in ``benchmarks.dbos_bench``).

Both check at the end that the table holds exactly 3 rows per workflow.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

POLL = 0.01


def _table(schema: str) -> str:
    return sql.Identifier(schema, "bench_rows").as_string(None)


def _create_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(f"CREATE TABLE {_table(schema)} (run text NOT NULL, step int NOT NULL)")


def _rows(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {_table(schema)}").fetchone()
        return int(row[0]) if row else 0


def run_dex(
    dsn: str, schema: str, runs: int, timeout: float, warmup: int = 20, async_steps: bool = False
) -> dict[str, Any]:
    import dex
    from dex.adapters.postgres import PostgresAdapter

    table = _table(schema)

    @dex.transaction(name="bench-insert")
    def insert(conn: psycopg.Connection, run: str, step: int) -> int:
        conn.execute(f"INSERT INTO {table} (run, step) VALUES (%s, %s)", [run, step])
        return step

    if async_steps:  # the same step as an ``async def`` on an AsyncConnection

        @dex.transaction(name="bench-insert")
        async def insert_async(conn: psycopg.AsyncConnection, run: str, step: int) -> int:
            await conn.execute(f"INSERT INTO {table} (run, step) VALUES (%s, %s)", [run, step])
            return step

        insert = insert_async  # type: ignore[assignment]

    @dex.workflow(name="bench-tx-three")
    async def three(ctx: dex.WorkflowContext, x: int) -> int:
        for step in range(3):
            await ctx.activity(insert, ctx.run_id, step)
        return x

    # ten steps at once, on connections of their own, as when they ran on a pool of 16 (its size
    # less the engine's six); the pool as it was
    adapter = PostgresAdapter(dsn, schema=schema, max_connections=16, step_connections=10)
    _create_table(dsn, schema)
    engine = dex.Engine(adapter, [three], [insert])
    engine.start()
    try:
        for run_id in [engine.start_workflow(three, i) for i in range(warmup)]:
            engine.wait(run_id, timeout=60)
        before = _xacts(dsn)
        started = time.perf_counter()
        run_ids = [engine.start_workflow(three, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        deadline = time.monotonic() + timeout
        done = sum(
            1 for i, r in enumerate(run_ids) if engine.wait(r, timeout=max(0.1, deadline - time.monotonic())) == i
        )
        seconds = time.perf_counter() - started
    finally:
        engine.stop()
        adapter.close()
    return _result(dsn, schema, runs, done, seconds, start_seconds, before, warmup)


def run_dbos(dsn: str, schema: str, runs: int, timeout: float, warmup: int = 20) -> dict[str, Any]:
    try:
        from dbos import DBOS, SQLAlchemyDatasource
    except ImportError:
        return {"skipped": "pip install -e '.[bench]'"}
    import sqlalchemy as sa

    from benchmarks.dbos_bench import sqlalchemy_url

    logging.getLogger("dbos").setLevel(logging.WARNING)
    _create_table(dsn, schema)
    url = sqlalchemy_url(dsn)
    DBOS(
        config={
            "name": "dex-bench-tx",
            "system_database_url": url,
            "dbos_system_schema": schema,
            "log_level": "WARNING",
        }
    )
    source = SQLAlchemyDatasource.create(url, schema=f"{schema}_ds")
    statement = sa.text(f"INSERT INTO {_table(schema)} (run, step) VALUES (:run, :step)")

    @source.transaction(name="bench-insert", isolation_level="READ COMMITTED")
    def insert(run: str, step: int) -> int:
        source.sql_session().execute(statement, {"run": run, "step": step})
        return step

    @DBOS.workflow(name="bench-tx-three")
    def three(x: int) -> int:
        for step in range(3):
            insert(str(DBOS.workflow_id), step)
        return x

    DBOS.launch()
    queue = DBOS.register_queue("bench-tx", worker_concurrency=64, polling_interval_sec=POLL)
    try:
        for i in range(warmup):
            queue.enqueue(three, i).get_result(polling_interval_sec=POLL)
        before = _xacts(dsn)
        started = time.perf_counter()
        handles = [queue.enqueue(three, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        deadline = time.monotonic() + timeout
        done = 0
        for i, handle in enumerate(handles):
            if time.monotonic() > deadline:
                break
            done += handle.get_result(polling_interval_sec=POLL) == i
        seconds = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return _result(dsn, schema, runs, done, seconds, start_seconds, before, warmup)


def _xacts(dsn: str) -> int:
    from benchmarks.pg import transactions

    return transactions(dsn, settle=0)


def _result(
    dsn: str, schema: str, runs: int, done: int, seconds: float, start_seconds: float, before: int, warmup: int
) -> dict[str, Any]:
    rows = _rows(dsn, schema)
    if rows != 3 * (runs + warmup):
        raise AssertionError(f"{rows} rows for {runs + warmup} workflows of 3 steps: not exactly once")
    xacts = _xacts(dsn) - before
    return {
        "n": runs,
        "done": done,
        "seconds": seconds,
        "start_seconds": start_seconds,
        "rate": done / seconds if seconds > 0 else 0.0,
        "rows": rows,
        "xacts_per_workflow": xacts / max(done, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("dex", "dbos"))
    parser.add_argument("--schema", required=True)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--async-steps", action="store_true", help="dex: the steps as async def functions")
    args = parser.parse_args()
    dsn = os.environ["DEX_BENCH_DSN"]
    if args.kind == "dex":
        result = run_dex(dsn, args.schema, args.runs, args.timeout, async_steps=args.async_steps)
    else:
        result = run_dbos(dsn, args.schema, args.runs, args.timeout)
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
