"""Stream read latency: from an item written to the same item read (docs/reference/contract.md §14).

``PYTHONPATH=. python -m benchmarks.stream_read [--items 200] [--gap 0.02] [--reader local|process]``
runs one workflow on a started engine over PostgreSQL (as ``benchmarks.run`` finds it) whose
activity writes ``--items`` stream items ``--gap`` seconds apart, each carrying the wall time at
which its write was made (``dex.activity_context().write_stream``, which returns once committed),
and then the workflow writes as many items itself, each carrying the time its activity ended
(so those include a workflow task's path). The reader records, for every item, how long after
its write it read it: ``local`` reads in the engine's process (``engine.read_stream``), ``process``
in a second Python process with an engine of its own (what a web server or another service does).
Prints the median, 90th percentile and maximum per kind of item, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dex
from benchmarks import pg
from dex.adapters.postgres import PostgresAdapter

ROOT = Path(__file__).resolve().parents[1]


@dex.activity(name="bench-ticks", lock_timeout=600)
def ticks(count: int, gap: float) -> float:
    for n in range(count):
        time.sleep(gap)
        dex.activity_context().write_stream("ticks", {"kind": "activity", "n": n, "sent": time.time()})
    return time.time()


@dex.activity(name="bench-stamp")
def stamp() -> float:
    return time.time()


@dex.workflow(name="bench-stream")
async def bench_stream(ctx: dex.WorkflowContext, count: int, gap: float) -> None:
    await ctx.wait_for_event("go")  # once the reader reads
    await ctx.activity(ticks, count, gap)
    for n in range(count):
        sent = await ctx.activity(stamp)  # the item's write follows this activity's end
        await ctx.write_stream("ticks", {"kind": "workflow", "n": n, "sent": sent})
    ctx.close_stream("ticks")


def read(engine: dex.Engine, run_id: str, ready: Callable[[], None]) -> list[tuple[str, float]]:
    """(kind, milliseconds from write to read) for every item of the run's stream; ``ready()``
    once the reader reads (the writes begin then)."""
    items = engine.read_stream(run_id, "ticks", timeout=120)
    ready()
    return [(item["kind"], (time.time() - item["sent"]) * 1000) for item in items]


def reader_main(dsn: str, schema: str, run_id: str) -> None:
    """The second process: read the stream, print the latencies as JSON."""
    adapter = PostgresAdapter(dsn, schema=schema, max_connections=2)
    try:
        latencies = read(dex.Engine(adapter), run_id, lambda: print("ready", file=sys.stderr, flush=True))
        print(json.dumps(latencies))
    finally:
        adapter.close()


def summary(latencies: list[tuple[str, float]]) -> str:
    lines = []
    for kind in ("activity", "workflow"):
        values = sorted(ms for k, ms in latencies if k == kind)
        if not values:
            continue
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        lines.append(
            f"{kind:8} items: {len(values):5}  median {statistics.median(values):7.2f} ms"
            f"  p90 {p90:7.2f} ms  max {values[-1]:7.2f} ms"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--reader", choices=("local", "process"), default="local")
    parser.add_argument("--reader-of", nargs=3, metavar=("DSN", "SCHEMA", "RUN_ID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader_of:
        reader_main(*args.reader_of)
        return
    dsn, where = pg.server_dsn()
    schema = pg.new_schema("bench_stream")
    adapter = PostgresAdapter(dsn, schema=schema)
    print(f"PostgreSQL: {where}; {args.items} items of each kind, {args.gap} s apart; reader: {args.reader}")
    try:
        with dex.Engine(adapter, workflows=[bench_stream], activities=[ticks, stamp], poll_interval=0.01) as engine:
            run_id = engine.start_workflow(bench_stream, args.items, args.gap)
            if args.reader == "local":
                latencies = read(engine, run_id, lambda: engine.send_event(run_id, "go"))
            else:
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                command = [sys.executable, "-m", "benchmarks.stream_read", "--reader-of", dsn, schema, run_id]
                with subprocess.Popen(
                    command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                ) as reader:
                    assert reader.stderr is not None
                    if reader.stderr.readline().strip() != "ready":
                        raise SystemExit(f"the reader failed: {reader.stderr.read()}")
                    engine.send_event(run_id, "go")
                    out, err = reader.communicate(timeout=600)
                if reader.returncode != 0:
                    raise SystemExit(err)
                latencies = [(kind, ms) for kind, ms in json.loads(out)]
            engine.wait(run_id, timeout=120)
        print(summary(latencies))
    finally:
        adapter.close()
        pg.drop_schema(dsn, schema)


if __name__ == "__main__":
    main()
