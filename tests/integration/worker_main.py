"""A worker process for the multi-process tests: one engine over a DSN and schema until SIGTERM.

    python -m tests.integration.worker_main --dsn DSN --schema SCHEMA --node-id NODE

It prints ``ready <node id>`` once its engine runs, and ``stopped <node id>`` after a graceful
stop (SIGTERM or SIGINT): the engine stops polling, lets the tasks it holds finish and
flushes their outcomes before the process exits 0. Leases are short (a few seconds), so the
work of a worker that is killed moves to the others quickly.
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
from tests.integration import workload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--activity-concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=3.0, help="workflow-task and leadership lease, seconds")
    parser.add_argument("--activity-lease", type=float, default=None, help="activity lease, seconds [engine default]")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {args.node_id} %(name)s %(levelname)s %(message)s"
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())

    workload.configure(args.dsn, args.schema)
    adapter = PostgresAdapter(args.dsn, schema=args.schema)
    engine = dex.Engine(
        adapter,
        workflows=workload.WORKFLOWS,
        activities=workload.ACTIVITIES,
        node_id=args.node_id,
        poll_interval=args.poll_interval,
        activity_concurrency=args.activity_concurrency,
        workflow_task_lease=timedelta(seconds=args.lease),
        leader_lease=timedelta(seconds=args.lease),
        **({} if args.activity_lease is None else {"activity_lease": timedelta(seconds=args.activity_lease)}),
    )
    engine.start()
    print(f"ready {args.node_id}", flush=True)
    while not stop.wait(0.5):
        pass
    engine.stop(timeout=30)
    adapter.close()
    print(f"stopped {args.node_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
