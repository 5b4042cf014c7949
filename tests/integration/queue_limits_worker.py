"""A worker process for the queue-limits test: one engine running tenant jobs, until SIGTERM.

    python -m tests.integration.queue_limits_worker --dsn DSN --schema SCHEMA --node-id NODE

A job (workflow queue ``tenants``) calls the activity ``call-api`` (activity queue ``api``),
which returns the wall-clock time its attempt began, then sleeps a little so that runs sharing
a concurrency key overlap if the key lets them. The test sets the queues' limits and reads the
recorded times. Prints ``ready <node id>`` once its engine runs.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from datetime import timedelta

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.activity(name="call-api", queue="api")
def call_api(n: int) -> float:
    return time.time()


@dex.workflow(name="tenant-job", queue="tenants")
async def tenant_job(ctx: dex.WorkflowContext, n: int) -> float:
    began = await ctx.activity(call_api, n)
    await ctx.sleep(timedelta(milliseconds=300))
    return began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--node-id", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    adapter = PostgresAdapter(args.dsn, schema=args.schema)
    engine = dex.Engine(
        adapter, workflows=[tenant_job], activities=[call_api], node_id=args.node_id, poll_interval=0.02
    )
    engine.start()
    print(f"ready {args.node_id}", flush=True)
    while not stop.wait(0.2):
        pass
    engine.stop(timeout=10)
    adapter.close()
    print(f"stopped {args.node_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
