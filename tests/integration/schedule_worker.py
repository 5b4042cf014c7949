"""A worker process for the schedule tests: one engine declaring a schedule, until SIGTERM.

    python -m tests.integration.schedule_worker --dsn DSN --schema SCHEMA --node-id NODE --every 1

Every process declares the same schedule (``tick``, every ``--every`` seconds, overlap
``allow_all``, a catch-up window of an hour); only the leader fires it. Prints ``ready
<node id>`` once its engine runs. Leases are short, so a killed leader is replaced quickly.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import timedelta

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.workflow
async def tick(ctx: dex.WorkflowContext) -> str:
    assert ctx.scheduled_at is not None
    return ctx.scheduled_at.isoformat()


def schedule(every: float) -> dex.Schedule:
    return dex.Schedule(
        "tick", tick, every=timedelta(seconds=every), overlap="allow_all", catchup_window=timedelta(hours=1)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--lease", type=float, default=2.0, help="leadership and workflow-task lease, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {args.node_id} %(name)s %(levelname)s %(message)s"
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    adapter = PostgresAdapter(args.dsn, schema=args.schema)
    engine = dex.Engine(
        adapter,
        workflows=[tick],
        schedules=[schedule(args.every)],
        node_id=args.node_id,
        poll_interval=0.05,
        workflow_task_lease=timedelta(seconds=args.lease),
        leader_lease=timedelta(seconds=args.lease),
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
