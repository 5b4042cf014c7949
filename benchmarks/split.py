"""Throughput with the application and the workers in separate processes, dex and DBOS alike.

``python -m benchmarks.split dex --schema S --runs N`` (and ``dbos``) starts a worker process
(``dex-worker``: an ``Engine`` started with the benchmark's workflows; ``dbos-worker``:
``DBOS.launch()`` with the same three-step workflow on a queue with ``worker_concurrency=64``
and a 10 ms polling interval), then, in this process, starts N workflows one after the other
through the public client API (``Engine.start_workflow`` on an engine that is not started;
``DBOSClient.enqueue``) and waits for each result (``Engine.wait``; ``get_result`` polling
every 10 ms). This is how a deployment runs them: the start loop no longer shares the GIL
with the workers. The DSN comes from ``DEX_BENCH_DSN``; prints one JSON line.

A worker prints ``ready`` once it runs and stops when its stdin closes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

POLL = 0.01
DBOS_WORKFLOW = "bench-three"
DBOS_QUEUE = "bench"


def dex_worker(dsn: str, schema: str) -> None:
    import dex
    from benchmarks.workloads import ACTIVITIES, WORKFLOWS
    from dex.adapters.postgres import PostgresAdapter

    adapter = PostgresAdapter(dsn, schema=schema)
    engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
    engine.start()
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        engine.stop()
        adapter.close()


def dbos_worker(dsn: str, schema: str) -> None:
    from dbos import DBOS

    from benchmarks.dbos_bench import dbos_app

    dbos_app(dsn, schema, "dex-bench-split", DBOS_WORKFLOW)
    DBOS.launch()
    DBOS.register_queue(DBOS_QUEUE, worker_concurrency=64, polling_interval_sec=POLL)
    try:
        print("ready", flush=True)
        sys.stdin.read()
    finally:
        DBOS.destroy()


def _spawn_worker(kind: str, schema: str) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.split", f"{kind}-worker", "--schema", schema],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if line.strip() != "ready":
        worker.kill()
        raise RuntimeError(f"the {kind} worker did not start (it said {line!r})")
    return worker


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds used so far by process ``pid`` (psutil), or None without psutil."""
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _stop_worker(worker: subprocess.Popen[str]) -> None:
    assert worker.stdin is not None
    worker.stdin.close()
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()


def dex_client(dsn: str, schema: str, runs: int, timeout: float) -> dict[str, Any]:
    import dex
    from benchmarks.dex_bench import CpuMeter, Deadline, wait_all
    from benchmarks.workloads import ACTIVITIES, WORKFLOWS, expected_three, three
    from dex.adapters.postgres import PostgresAdapter

    adapter = PostgresAdapter(dsn, schema=schema)  # creates the schema before the worker uses it
    client = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)  # never started
    worker = _spawn_worker("dex", schema)
    try:
        for i in range(20):  # warm-up: both processes' connections, prepared statements
            assert client.wait(client.start_workflow(three, 10_000_000 + i), timeout=60) == expected_three(
                10_000_000 + i
            )
        deadline = Deadline(timeout)
        cpu, worker_cpu = CpuMeter(dsn), _cpu_seconds(worker.pid)
        started = time.perf_counter()
        run_ids = [client.start_workflow(three, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        done = wait_all(client, run_ids, deadline)
        seconds = time.perf_counter() - started
        usage = _usage(cpu, worker.pid, worker_cpu, seconds)
    finally:
        _stop_worker(worker)
        adapter.close()
    return _result(runs, done, seconds, start_seconds, usage)


def dbos_client(dsn: str, schema: str, runs: int, timeout: float) -> dict[str, Any]:
    from dbos import DBOSClient

    from benchmarks.dbos_bench import sqlalchemy_url
    from benchmarks.dex_bench import CpuMeter

    worker = _spawn_worker("dbos", schema)  # DBOS makes its schema at launch
    client = DBOSClient(system_database_url=sqlalchemy_url(dsn), dbos_system_schema=schema)
    options: Any = {"queue_name": DBOS_QUEUE, "workflow_name": DBOS_WORKFLOW}
    try:
        for i in range(20):
            assert client.enqueue(options, i).get_result(polling_interval_sec=POLL) == (i + 1) * 2 - 1
        deadline = time.monotonic() + timeout
        cpu, worker_cpu = CpuMeter(dsn), _cpu_seconds(worker.pid)
        started = time.perf_counter()
        handles: list[Any] = [client.enqueue(options, i) for i in range(runs)]
        start_seconds = time.perf_counter() - started
        done = 0
        for i, handle in enumerate(handles):
            if time.monotonic() > deadline:
                break
            assert handle.get_result(polling_interval_sec=POLL) == (i + 1) * 2 - 1
            done += 1
        seconds = time.perf_counter() - started
        usage = _usage(cpu, worker.pid, worker_cpu, seconds)
    finally:
        client.destroy()
        _stop_worker(worker)
    return _result(runs, done, seconds, start_seconds, usage)


def _usage(cpu: Any, pid: int, worker_before: float | None, wall: float) -> dict[str, Any]:
    """This process's, the worker's and the server's CPU seconds; the other processes' share of
    the machine without the worker (``CpuMeter`` counts the worker among the others)."""
    usage: dict[str, Any] = cpu.stop()
    after = _cpu_seconds(pid)
    worker = after - worker_before if after is not None and worker_before is not None else None
    usage["worker_cpu_seconds"] = worker
    share = usage.get("other_cpu_share")
    if share is not None and worker is not None and wall > 0:
        usage["other_cpu_share"] = max(0.0, share - worker / (wall * (os.cpu_count() or 1)))
    return usage


def _result(runs: int, done: int, seconds: float, start_seconds: float, usage: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.dex_bench import batch_result

    return batch_result(runs, done, seconds, start_seconds) | usage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["dex", "dbos", "dex-worker", "dbos-worker"])
    parser.add_argument("--schema", required=True)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    dsn = os.environ["DEX_BENCH_DSN"]
    if args.role == "dex-worker":
        dex_worker(dsn, args.schema)
    elif args.role == "dbos-worker":
        dbos_worker(dsn, args.schema)
    elif args.role == "dex":
        print(json.dumps(dex_client(dsn, args.schema, args.runs, args.timeout)), flush=True)
    else:
        try:
            import dbos  # noqa: F401
        except ImportError:
            print(json.dumps({"skipped": "pip install -e '.[bench]'"}))
            return
        print(json.dumps(dbos_client(dsn, args.schema, args.runs, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
