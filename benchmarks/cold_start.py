"""Cold starts: the engine-alone batch in fresh processes, with what each run's engine did (a tool).

``PYTHONPATH=. python -m benchmarks.cold_start [--runs 20] [-n 2000]`` runs ``--runs`` fresh
processes one after the other, each doing what ``benchmarks.run``'s *engine alone* does (``n``
three-activity workflows created while the engine is stopped, then ``engine.start()`` → the
last result, on a fresh schema), and prints each run's rate with what explains it:

- ``ordinary``: activity outcomes written by the activity flusher (attempts that did not run
  inline in their workflow task: the first attempt of each name in a process, and those that
  found no room); the "slow steady state" of docs/decisions/answered-and-chained-steps.md would show as hundreds or thousands;
- ``wf writes`` and ``flushes``: workflow-task results written, and how many flushes wrote them
  (results per flush: the batching the engine reached);
- ``others``: the share of the two cores used by other processes during the run (/proc/stat
  less this process and the benchmark's server), the neighbours' load;
- ``cpu ms/wf``: this process's CPU per workflow.

Then the median, the slowest run's share of it, and how many runs reached 70 % of it (issue
26's cold-start criterion). PostgreSQL as ``benchmarks.run`` finds it (``DEX_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import dex
from benchmarks import pg
from benchmarks.dex_bench import CpuMeter, Deadline, fresh_schema, wait_all
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, three
from dex.adapters.postgres import PostgresAdapter


def one(dsn: str, n: int) -> dict[str, Any]:
    """One engine-alone batch in this process, with the engine's writes counted."""
    counts = {"ordinary": 0, "activity_flushes": 0, "wf_writes": 0, "wf_flushes": 0}
    with fresh_schema(dsn, "bench_cold") as schema:
        adapter = PostgresAdapter(dsn, schema=schema)
        _count(adapter, "complete_activity_tasks_then_claim", counts, "ordinary", "activity_flushes")
        _count(adapter, "complete_activity_tasks", counts, "ordinary", "activity_flushes")
        _count(adapter, "complete_workflow_tasks_then_claim", counts, "wf_writes", "wf_flushes")
        _count(adapter, "complete_workflow_tasks", counts, "wf_writes", "wf_flushes")
        engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        try:
            run_ids = [engine.start_workflow(three, i) for i in range(n)]
            deadline = Deadline(600)
            meter = CpuMeter(dsn)
            started = time.perf_counter()
            engine.start()
            done = wait_all(engine, run_ids, deadline)
            seconds = time.perf_counter() - started
            cpu = meter.stop()
        finally:
            engine.stop()
            adapter.close()
    return {
        "n": n,
        "done": done,
        "seconds": seconds,
        "rate": done / seconds,
        "cpu_ms_per_workflow": cpu["client_cpu_seconds"] * 1000 / max(done, 1),  # type: ignore[operator]
        "others": cpu["other_cpu_share"],
        **counts,
    }


def _count(adapter: PostgresAdapter, name: str, counts: dict[str, int], items: str, calls: str) -> None:
    method = getattr(adapter, name)

    def counted(batch: Any, *args: Any, **kwargs: Any) -> Any:
        counts[items] += len(batch)
        counts[calls] += 1
        return method(batch, *args, **kwargs)

    setattr(adapter, name, counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--one", action="store_true", help="(internal) one run in this process, as JSON")
    args = parser.parse_args()
    dsn, _where = pg.server_dsn()
    if args.one:
        print(json.dumps(one(dsn, args.n)))
        return
    rows = []
    for i in range(args.runs):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.cold_start", "--one", "-n", str(args.n)],
            check=True,
            capture_output=True,
            text=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"run {i + 1:2}: {row['rate']:7.0f} wf/s  ordinary {row['ordinary']:5}  "
            f"wf writes {row['wf_writes']:5} in {row['wf_flushes']:4} flushes  "
            f"others {100 * (row['others'] or 0):3.0f} %  cpu {row['cpu_ms_per_workflow']:.2f} ms/wf",
            flush=True,
        )
    rates = [row["rate"] for row in rows]
    median = statistics.median(rates)
    slowest = min(rates)
    print(
        f"median {median:.0f} wf/s; slowest {slowest:.0f} ({100 * slowest / median:.0f} % of the median); "
        f"{sum(rate >= 0.7 * median for rate in rates)} of {len(rates)} runs at 70 % or more"
    )


if __name__ == "__main__":
    main()
