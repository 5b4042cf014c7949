"""The workload of the transaction-step crash test: runs of several ``@dex.transaction`` steps,
each inserting one row into a table without a unique constraint, and a worker process for it.

    python -m tests.integration.tx_workload --dsn DSN --schema SCHEMA --node-id NODE

The worker prints ``ready <node id>`` once its engine runs; the test kills it with SIGKILL.
Each step sleeps a little inside its transaction, so that kills land mid-transaction too; with
``--inline-seconds 0.5`` the worker runs the steps in groups (several runs' steps in one
transaction), so kills land mid-group too.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter

STEPS = 4
LEDGER: dict[str, str] = {}  # "table": the schema-qualified ledger table


def ledger_table(schema: str) -> str:
    return sql.Identifier(schema, "tx_ledger").as_string(None)


def create_ledger(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # tx: the transaction that wrote the row (steps run in a group share one, dex.app.workflows.step_groups)
        conn.execute(
            f"CREATE TABLE {ledger_table(schema)}"
            " (run_id text NOT NULL, step int NOT NULL, pid int, tx bigint NOT NULL DEFAULT txid_current())"
        )


@dex.transaction(name="ledger-insert", retry=dex.RetryPolicy(initial_delay=0.05, max_attempts=50))
def ledger_insert(conn: Any, run_id: str, step: int, pause: float) -> int:
    import os

    conn.execute(f"INSERT INTO {LEDGER['table']} (run_id, step, pid) VALUES (%s, %s, %s)", [run_id, step, os.getpid()])
    time.sleep(pause)  # inside the transaction: a kill now must leave nothing behind
    return step


@dex.workflow(name="ledger-run")
async def ledger_run(ctx: dex.WorkflowContext, pause: float) -> list[int]:
    return [await ctx.activity(ledger_insert, ctx.run_id, n, pause) for n in range(STEPS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--node-id", required=True)
    # at 0.5 s the steps (which sleep up to 0.3 s) run in groups inside their workflow tasks
    parser.add_argument("--inline-seconds", type=float, default=0.005)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    LEDGER["table"] = ledger_table(args.schema)
    adapter = PostgresAdapter(args.dsn, schema=args.schema)
    engine = dex.Engine(
        adapter,
        workflows=[ledger_run],
        activities=[ledger_insert],
        node_id=args.node_id,
        activity_concurrency=4,
        workflow_task_lease=timedelta(seconds=2),
        leader_lease=timedelta(seconds=2),
        activity_lease=timedelta(seconds=2),
        inline_activity_seconds=args.inline_seconds,
    )
    engine.start()
    print(f"ready {args.node_id}", flush=True)
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
