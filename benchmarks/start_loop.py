"""What one start costs: ``python -m benchmarks.start_loop [-n N] [--repeat K]``.

Starts N three-activity workflows one after the other through ``Engine.start_workflow`` on an
engine that is not started (nothing else runs in the process), K times on fresh schemas, and
prints the wall time and this process's CPU time per start. The start is the sequential part
of the throughput batch, so this is the figure that bounds it. A tool, not a benchmark part.
PostgreSQL is ``DEX_DATABASE_URL`` or an embedded server, as for ``benchmarks.run``.
"""

from __future__ import annotations

import argparse
import time

import dex
from benchmarks import pg
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, three
from dex.adapters.postgres import PostgresAdapter


def start_loop(dsn: str, n: int, warmup: int = 50) -> tuple[float, float]:
    """(wall ms, client CPU ms) per start, over ``n`` starts after ``warmup`` ones."""
    schema = pg.new_schema("bench_starts")
    try:
        adapter = PostgresAdapter(dsn, schema=schema)
        try:
            engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
            for i in range(warmup):
                engine.start_workflow(three, i)
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(n):
                engine.start_workflow(three, i)
            return (time.perf_counter() - wall) * 1000 / n, (time.process_time() - cpu) * 1000 / n
        finally:
            adapter.close()
    finally:
        pg.drop_schema(dsn, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="starts per repetition (default 3000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3)")
    args = parser.parse_args()
    dsn, where = pg.server_dsn()
    print(f"PostgreSQL: {where}")
    for _ in range(args.repeat):
        wall, cpu = start_loop(dsn, args.n)
        print(f"{args.n} starts: {wall:.3f} ms per start (wall), {cpu:.3f} ms of this process's CPU")


if __name__ == "__main__":
    main()
