"""I/O-bound activities and every activity a task of its own, dex and DBOS side by side.

``python -m benchmarks.io_bound dex --schema S --runs N [--concurrency C] [--io SECONDS]
[--inline-seconds X] [--chained-seconds Y] [--queues-read-full] [--starts-keep-the-gil]
[--async-activities]`` runs, in this process, N three-activity workflows on a started engine
(``activity_concurrency=C``, ``inline_activity_seconds=X``, ``chained_activity_seconds=Y``); with ``--io`` each activity first waits that long
(``time.sleep``, as a call to a service would; with ``--async-activities``, ``async def``
activities ``await asyncio.sleep``, as an asyncio client would), otherwise the activities are
the headline benchmark's ``x+1``, ``x*2``, ``x-1``. ``dbos`` runs the same on DBOS Transact
(three ``@DBOS.step``s on a queue with ``worker_concurrency=C``, 10 ms polling). The DSN comes
from ``DEX_BENCH_DSN``; prints one JSON line: rate, CPU, the lone workflow's latency.

Each run is a process of its own (DBOS keeps process-global state), and ``part_io`` /
``part_every`` (``benchmarks.run --only io,every``) alternate dex and DBOS so that DBOS is set
against dex's runs just before and after it: the host drifts by tens of percent in minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import attrs

POLL = 0.01
IO_CONCURRENCIES = (16, 64)


def _latency(start: Any, wait: Any, samples: int) -> float:
    observed = []
    for i in range(samples):
        time.sleep(0.3)  # every poller idle again
        started = time.perf_counter()
        wait(start(i))
        observed.append(time.perf_counter() - started)
    return statistics.median(observed)


def dex_run(
    dsn: str,
    schema: str,
    runs: int,
    concurrency: int | None,
    io: float,
    inline: float | None,
    samples: int,
    cpu: float = 0.0,
    queues_full: bool = False,
    starts_keep_the_gil: bool = False,
    awaited: bool = False,
    chained: float | None = None,
) -> dict[str, Any]:
    import dex
    from benchmarks import workloads
    from benchmarks.dex_bench import CpuMeter, Deadline, batch_result
    from dex.adapters.postgres import PostgresAdapter

    workloads.IO_SECONDS, workloads.CPU_SECONDS = io, cpu
    workflow = workloads.aio_three if awaited else workloads.io_three if io or cpu else workloads.three
    options: dict[str, Any] = {} if concurrency is None else {"activity_concurrency": concurrency}
    if inline is not None:
        options["inline_activity_seconds"] = inline
    if chained is not None:
        options["chained_activity_seconds"] = chained
    adapter = PostgresAdapter(dsn, schema=schema)
    if queues_full:
        read_queues_as_full(adapter)
    engine = dex.Engine(adapter, workflows=workloads.WORKFLOWS, activities=workloads.ACTIVITIES, **options)
    engine.start()
    if starts_keep_the_gil:
        keep_the_gil_while_starting()
    try:
        for i in range(20):  # warm-up: connections, prepared statements, activity durations
            engine.wait(engine.start_workflow(workflow, 10_000_000 + i), timeout=60)
        latency = _latency(lambda i: engine.start_workflow(workflow, i), lambda r: engine.wait(r, timeout=60), samples)
        deadline = Deadline(300)
        meter = CpuMeter(dsn)
        started = time.perf_counter()
        run_ids = [engine.start_workflow(workflow, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        done = 0
        for i, run_id in enumerate(run_ids):
            if engine.wait(run_id, timeout=deadline.left()) != workloads.expected_three(i):
                raise AssertionError(f"run {run_id}: wrong result")
            done += 1
        result = batch_result(runs, done, time.perf_counter() - started, start_seconds)
        result.update(meter.stop(), latency_median=latency)
    finally:
        engine.stop()
        adapter.close()
    return result


def read_queues_as_full(adapter: Any) -> None:
    """The engine reads every activity queue with all its slots held, as a backlog leaves it
    (its inline attempts then see no room; the scheduler, which counts in SQL, still finds it):
    the "slow steady state" a backlog could bring, on demand. Trees before ``activity_slots``
    read ``list_queues``' depth instead."""
    if hasattr(adapter, "activity_slots"):
        slots = adapter.activity_slots
        adapter.activity_slots = lambda: [attrs.evolve(s, held=s.capacity) for s in slots()]
    else:  # pragma: no cover - an older tree, for alternated pairs
        queues = adapter.list_queues
        adapter.list_queues = lambda: [attrs.evolve(q, depth=q.capacity) for q in queues()]


def keep_the_gil_while_starting() -> None:
    """A probe, not a proposal: the start's statement (the one ``DirectStatement`` of dex) waits
    for its answer holding the GIL (libc ``poll`` through ``ctypes.PyDLL``, then libpq's
    non-blocking calls), so the starting thread never queues for the GIL behind the engine's
    threads, which meanwhile cannot run at all. What it shows: whether the batch is bound by the
    start loop's waits or by the process's one core of Python (BENCHMARKS.md, *What bounds the
    batches*). It blocks the whole process for each start's round trip: never for real use."""
    import select

    from psycopg import pq
    from psycopg.errors import error_from_result

    from dex.adapters.postgres import direct
    from dex.adapters.postgres.connection import poll_keeping_the_gil

    def execute(self: Any, conn: Any, params: Any) -> Any:
        self.check(params)
        pgconn = conn.pgconn
        with conn.lock:
            pgconn.send_query_params(self.query, params, self.types, self.formats)
            poll_keeping_the_gil(pgconn.socket, 2)  # up to 2 ms with the GIL held; then as usual
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                select.select([pgconn.socket], [], [], 1.0)
            result = pgconn.get_result()
            while pgconn.get_result() is not None:
                pass
        if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise error_from_result(result, encoding=conn.info.encoding)
        return result

    direct.DirectStatement.execute = execute  # type: ignore[method-assign]


def dbos_run(dsn: str, schema: str, runs: int, concurrency: int, io: float, samples: int) -> dict[str, Any]:
    try:
        from dbos import DBOS
    except ImportError:
        return {"skipped": True}
    from benchmarks.dbos_bench import dbos_app
    from benchmarks.dex_bench import CpuMeter, batch_result

    three = dbos_app(dsn, schema, "dex-bench-io", io=io)
    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=concurrency, polling_interval_sec=POLL)
    try:
        for i in range(5):
            queue.enqueue(three, i).get_result(polling_interval_sec=POLL)
        latency = _latency(
            lambda i: queue.enqueue(three, i), lambda h: h.get_result(polling_interval_sec=POLL), samples
        )
        cpu = CpuMeter(dsn)
        started = time.perf_counter()
        handles = [queue.enqueue(three, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        done = 0
        for i, handle in enumerate(handles):
            assert handle.get_result(polling_interval_sec=POLL) == (i + 1) * 2 - 1
            done += 1
        result = batch_result(runs, done, time.perf_counter() - started, start_seconds)
        result.update(cpu.stop(), latency_median=latency)
    finally:
        DBOS.destroy()
    return result


# -- the parts of benchmarks.run ------------------------------------------------------------------
def _child(dsn: str, cfg: dict[str, Any], kind: str, runs: int, extra: list[str]) -> dict[str, Any]:
    from benchmarks import dex_bench
    from benchmarks.common import run_child, settle

    settle(cfg)
    with dex_bench.fresh_schema(dsn, f"bench_io_{kind}") as schema:
        args = [kind, "--schema", schema, "--runs", str(runs), *extra]
        return run_child("benchmarks.io_bound", args, dsn, timeout=cfg["timeout"] + 180)


def part_io(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    """3 × 20 ms of I/O per workflow: dex at 16 and 64 activity threads, and at 64 with nothing
    chained (each activity a task: ``chained_activity_seconds=0``), DBOS at 64, dex again."""
    from benchmarks.common import table

    runs = max(200, cfg["n"] // 4)
    io = ["--io", "0.02"]
    unchained = ["--chained-seconds", "0"]
    measured: dict[str, dict[str, Any]] = {}
    for key, kind, concurrency, extra in (
        ("dex_16", "dex", 16, []),
        ("dex_64", "dex", 64, []),
        ("dex_64_unchained", "dex", 64, unchained),
        ("dbos_64", "dbos", 64, []),
        ("dex_16_after", "dex", 16, []),
        ("dex_64_after", "dex", 64, []),
        ("dex_64_unchained_after", "dex", 64, unchained),
    ):
        measured[key] = _child(dsn, cfg, kind, runs, [*io, "--concurrency", str(concurrency), *extra])
    results["io"] = measured
    return _table(table, measured, "3 × 20 ms of I/O per workflow (time.sleep in each activity)", runs)


def part_every(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    """Every activity a task of its own (``inline_activity_seconds=0``; dex's default activity
    threads), DBOS as in ``dbos``."""
    from benchmarks.common import table

    runs = cfg["n"]
    measured: dict[str, dict[str, Any]] = {}
    for key, kind, extra in (
        ("dex", "dex", ["--inline-seconds", "0"]),
        ("dbos_64", "dbos", ["--concurrency", "64"]),
        ("dex_after", "dex", ["--inline-seconds", "0"]),
    ):
        measured[key] = _child(dsn, cfg, kind, runs, extra)
    results["every"] = measured
    return _table(table, measured, "every activity a task of its own (inline_activity_seconds=0)", runs)


def _table(table: Any, measured: dict[str, dict[str, Any]], title: str, runs: int) -> str:
    dbos = measured["dbos_64"]
    rows: list[list[Any]] = []
    for key, r in measured.items():
        if r.get("skipped"):
            rows.append([key, "skipped", None, None, None, None])
            continue
        cpu = (r["client_cpu_seconds"] + (r["server_cpu_seconds"] or 0.0)) * 1000 / max(r["done"], 1)
        ratio = r["rate"] / dbos["rate"] if not dbos.get("skipped") and key != "dbos_64" else None
        rows.append([key, r["rate"], ratio, cpu, r["latency_median"] * 1000, f"{r.get('other_cpu_share') or 0:.0%}"])
    return table(
        f"{title}, {runs} workflows",
        [
            "run (in order)",
            "workflows/s",
            "× DBOS",
            "CPU ms/workflow (process + PostgreSQL)",
            "lone, ms",
            "others' CPU",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.io_bound")
    parser.add_argument("kind", choices=("dex", "dbos"))
    parser.add_argument("--schema", required=True)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=None, help="dex: the engine's default if not given")
    parser.add_argument("--io", type=float, default=0.0, help="seconds each activity waits")
    parser.add_argument("--cpu", type=float, default=0.0, help="seconds of CPU each activity uses (dex only)")
    parser.add_argument("--inline-seconds", type=float, default=None)
    parser.add_argument(
        "--chained-seconds", type=float, default=None, help="dex: chained_activity_seconds (0: nothing chained)"
    )
    parser.add_argument("--latency-samples", type=int, default=21)
    parser.add_argument(
        "--queues-read-full",
        action="store_true",
        help="dex: the engine reads its activity queues as a backlog leaves them",
    )
    parser.add_argument(
        "--starts-keep-the-gil",
        action="store_true",
        help="dex, a probe: each start waits for its answer holding the GIL (what bounds the batch?)",
    )
    parser.add_argument(
        "--async-activities",
        action="store_true",
        help="dex: async def activities that await asyncio.sleep(--io) instead of time.sleep",
    )
    args = parser.parse_args()
    dsn = os.environ["DEX_BENCH_DSN"]
    if args.kind == "dex":
        result = dex_run(
            dsn,
            args.schema,
            args.runs,
            args.concurrency,
            args.io,
            args.inline_seconds,
            args.latency_samples,
            args.cpu,
            args.queues_read_full,
            args.starts_keep_the_gil,
            args.async_activities,
            args.chained_seconds,
        )
    else:
        result = dbos_run(dsn, args.schema, args.runs, args.concurrency or 64, args.io, args.latency_samples)
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
