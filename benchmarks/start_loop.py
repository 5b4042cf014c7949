"""What one start costs: ``python -m benchmarks.start_loop [-n N] [--repeat K] [--in-process]``.

Starts N three-activity workflows one after the other through ``Engine.start_workflow``, K
times on fresh schemas, and prints the wall time per start and how the starting thread spent
it, from the kernel's scheduler statistics for that thread (``/proc/self/task/<tid>/schedstat``):

- *on CPU*: running (Python, psycopg, libpq);
- *run queue*: ready to run but waiting for a core (the machine is busy);
- *blocked*: neither, i.e. waiting for PostgreSQL's answer or for the GIL (which the kernel
  cannot tell apart: both are a sleep).

By default the engine is not started (nothing else runs in the process): the start alone,
which bounds the throughput batch. ``--in-process`` runs the same loop on a started engine
that runs the workflows meanwhile, as the throughput batch does (each repetition's runs are
waited for before the next), so the difference between the two rows is what sharing the
process and the machine with the engine costs a start. A tool, not a benchmark part.
PostgreSQL is ``DEX_DATABASE_URL`` or an embedded server, as for ``benchmarks.run``.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import NamedTuple

import dex
from benchmarks import pg
from benchmarks.dex_bench import Deadline, wait_all
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, three
from dex.adapters.postgres import PostgresAdapter


class SchedStat(NamedTuple):
    """A thread's scheduler statistics: nanoseconds on a CPU and waiting in a run queue, and
    how many times it was put on a CPU (``/proc/.../schedstat``; zeros where there is none)."""

    on_cpu_ns: int
    run_queue_ns: int
    slices: int


def parse_schedstat(text: str) -> SchedStat:
    """The three numbers of a ``schedstat`` file; ValueError if ``text`` is not one."""
    fields = text.split()
    if len(fields) != 3:
        raise ValueError(f"a schedstat file holds three numbers, got {text!r}")
    on_cpu, run_queue, slices = (int(field) for field in fields)
    return SchedStat(on_cpu, run_queue, slices)


def thread_schedstat() -> SchedStat:
    """This thread's scheduler statistics (zeros on a kernel without schedstats)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
            return parse_schedstat(stat.read())
    except (OSError, ValueError):
        return SchedStat(0, 0, 0)


def per_start(wall: float, before: SchedStat, after: SchedStat, n: int) -> dict[str, float]:
    """Milliseconds per start of wall time, on CPU, in the run queue and blocked (the rest)."""
    on_cpu = (after.on_cpu_ns - before.on_cpu_ns) / 1e9
    run_queue = (after.run_queue_ns - before.run_queue_ns) / 1e9
    return {
        "wall": wall * 1000 / n,
        "on_cpu": on_cpu * 1000 / n,
        "run_queue": run_queue * 1000 / n,
        "blocked": max(0.0, wall - on_cpu - run_queue) * 1000 / n,
        "slices": (after.slices - before.slices) / n,
    }


def start_loop(dsn: str, n: int, warmup: int = 50, in_process: bool = False) -> dict[str, float]:
    """Per-start figures (see :func:`per_start`) over ``n`` starts after ``warmup`` ones, on an
    engine that is started (``in_process``) or not."""
    schema = pg.new_schema("bench_starts")
    try:
        adapter = PostgresAdapter(dsn, schema=schema)
        engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        try:
            if in_process:
                engine.start()
            warm = [engine.start_workflow(three, i) for i in range(warmup)]
            if in_process:
                wait_all(engine, warm, Deadline(60))
            before, started = thread_schedstat(), time.perf_counter()
            run_ids = [engine.start_workflow(three, i) for i in range(n)]
            figures = per_start(time.perf_counter() - started, before, thread_schedstat(), n)
            if in_process and wait_all(engine, run_ids, Deadline(120)) < n:
                raise TimeoutError(f"the engine did not finish the {n} runs in 120 s")
            return figures
        finally:
            engine.stop()
            adapter.close()
    finally:
        pg.drop_schema(dsn, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="starts per repetition (default 3000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--in-process", action="store_true", help="also with a started engine running the runs")
    args = parser.parse_args()
    dsn, where = pg.server_dsn()
    print(f"PostgreSQL: {where}")
    print("| engine | ms per start | on CPU | run queue | blocked (server or GIL) | CPU slices per start |")
    print("|---|---:|---:|---:|---:|---:|")
    for _ in range(args.repeat):
        for in_process in (False, True) if args.in_process else (False,):
            f = start_loop(dsn, args.n, in_process=in_process)
            label = "started, running the runs" if in_process else "not started"
            print(
                f"| {label} | {f['wall']:.3f} | {f['on_cpu']:.3f} | {f['run_queue']:.3f} | {f['blocked']:.3f}"
                f" | {f['slices']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
