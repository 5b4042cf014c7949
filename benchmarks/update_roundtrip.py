"""Update round trips and query latency on PostgreSQL (docs/reference/contract.md §14).

``PYTHONPATH=. python -m benchmarks.update_roundtrip [--updates 200] [--batch 2000] [--queries 200]``
measures, on a started engine over a fresh schema:

- **idle**: ``--updates`` updates, one after the other, to one run that does nothing else; each
  round trip is one workflow task and its writes (the request's insert, the task, the answer's
  NOTIFY), with no poll interval;
- **under load**: the same while a batch of ``--batch`` three-activity workflows
  (``benchmarks.workloads.three``) runs on the same engine;
- **query, cached**: ``--queries`` queries answered from the executor the engine keeps;
- **query, replayed**: the same from a second engine that keeps no executor
  (``executor_cache_size=0``), which replays the run's history in the caller's thread (the
  history then holds every update above: hundreds of events).

Prints the median, 95th and 99th percentile of each in milliseconds, and the batch's rate.
PostgreSQL as ``benchmarks.run`` finds it (``DEX_DATABASE_URL``, else an embedded server).
Figures belong in BENCHMARKS.md only when measured on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import dex
from benchmarks import pg
from benchmarks.common import table
from benchmarks.dex_bench import Deadline, fresh_schema, wait_all
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, three
from dex.adapters.postgres import PostgresAdapter


@dex.workflow(name="bench-counter")
async def counter(ctx: dex.WorkflowContext) -> int:
    count = 0
    stop = False

    @ctx.on_update("add")
    def add(n: int) -> int:
        nonlocal count
        count += n
        return count

    @ctx.on_update("stop")
    def finish() -> int:
        nonlocal stop
        stop = True
        return count

    @ctx.on_query("count")
    def current() -> int:
        return count

    await ctx.wait_condition(lambda: stop)
    return count


def timed(calls: int, call: Callable[[int], Any]) -> list[float]:
    """Seconds each of ``calls`` calls took."""
    seconds = []
    for i in range(calls):
        started = time.perf_counter()
        call(i)
        seconds.append(time.perf_counter() - started)
    return seconds


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 2)

    return {"median_ms": round(statistics.median(ordered) * 1000, 2), "p95_ms": at(0.95), "p99_ms": at(0.99)}


def measure(dsn: str, updates: int, batch: int, queries: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with fresh_schema(dsn, "bench_updates") as schema:
        adapter = PostgresAdapter(dsn, schema=schema)
        engine = dex.Engine(adapter, workflows=[counter, *WORKFLOWS], activities=ACTIVITIES)
        engine.start()
        try:
            run_id = engine.start_workflow(counter)
            engine.update(run_id, "add", 0, timeout=30)  # the run has started and holds its handlers
            results["idle"] = summary(timed(updates, lambda i: engine.update(run_id, "add", 1, timeout=30)))
            load = [engine.start_workflow(three, i) for i in range(batch)]
            started = time.perf_counter()
            results["under_load"] = summary(timed(updates, lambda i: engine.update(run_id, "add", 1, timeout=60)))
            done = wait_all(engine, load, Deadline(600))
            results["batch"] = {"workflows": done, "rate_per_s": round(done / (time.perf_counter() - started), 1)}
            results["query_cached"] = summary(timed(queries, lambda i: engine.query(run_id, "count")))
            elsewhere_adapter = PostgresAdapter(dsn, schema=schema)
            elsewhere = dex.Engine(elsewhere_adapter, workflows=[counter], executor_cache_size=0)
            elsewhere.start()  # started: a query does not drive it, it replays
            try:
                results["query_replayed"] = summary(timed(queries, lambda i: elsewhere.query(run_id, "count")))
                results["history_events"] = len(engine.history(run_id))
            finally:
                elsewhere.stop()
                elsewhere_adapter.close()
            assert engine.update(run_id, "stop", timeout=30) == 2 * updates
        finally:
            engine.stop()
            adapter.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.update_roundtrip")
    parser.add_argument("--updates", type=int, default=200, help="updates in each series")
    parser.add_argument("--batch", type=int, default=2000, help="three-activity workflows of the load")
    parser.add_argument("--queries", type=int, default=200, help="queries in each series")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()
    dsn, where = pg.server_dsn()
    results = measure(dsn, options.updates, options.batch, options.queries)
    if options.json:
        print(json.dumps(results))
        return
    print(f"PostgreSQL: {where}")
    rows = [
        [name, *(results[name][k] for k in ("median_ms", "p95_ms", "p99_ms"))]
        for name in ("idle", "under_load", "query_cached", "query_replayed")
    ]
    print(table("update round trip and query latency (ms)", ["series", "median", "p95", "p99"], rows))
    print(
        f"load: {results['batch']['workflows']} workflows at {results['batch']['rate_per_s']}/s;"
        f" the replayed run's history: {results['history_events']} events"
    )


if __name__ == "__main__":
    main()
