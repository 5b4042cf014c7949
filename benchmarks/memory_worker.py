"""A worker process holding many waiting runs; prints its resident memory as JSON.

Run by ``benchmarks.run`` in a subprocess (so nothing else inflates the figure):
``python -m benchmarks.memory_worker --schema S --runs 10000`` with the DSN in
``DEX_BENCH_DSN``. The process starts an engine, starts ``--runs`` workflows that each run one
activity and then wait on a timer a year away (through the public API, so the worker drives
every one of them to its timer), waits until all are waiting, and reports its RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


def rss_bytes() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process, from /proc."""
    values: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schema", required=True)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    dsn = os.environ["DEX_BENCH_DSN"]

    import dex
    from benchmarks.workloads import ACTIVITIES, WORKFLOWS, three, waiter
    from dex.adapters.postgres import PostgresAdapter

    deadline = time.monotonic() + args.timeout
    adapter = PostgresAdapter(dsn, schema=args.schema)
    engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
    engine.start()
    try:
        engine.wait(engine.start_workflow(three, 1), timeout=30)
        gc.collect()
        time.sleep(0.5)
        baseline, _ = rss_bytes()
        started = time.perf_counter()
        run_ids = [engine.start_workflow(waiter, i) for i in range(args.runs)]
        waiting = 0
        for run_id in run_ids:  # every run has reached its timer
            while True:
                kinds = [event.kind for event in engine.history(run_id)]
                if "TimerCreated" in kinds and kinds[-1] == "WorkflowTaskCompleted":
                    waiting += 1
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {waiting} of {args.runs} runs reached their timer in time")
                time.sleep(0.05)
        settle_seconds = time.perf_counter() - started
        _, peak_while_driving = rss_bytes()
        time.sleep(3)  # a few idle polling rounds while holding them
        gc.collect()
        holding, peak = rss_bytes()
    finally:
        engine.stop()
        adapter.close()
    print(
        json.dumps(
            {
                "runs": args.runs,
                "waiting": waiting,
                "baseline_rss": baseline,
                "holding_rss": holding,
                "peak_rss": max(peak, peak_while_driving),
                "drive_seconds": settle_seconds,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
