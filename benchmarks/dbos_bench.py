"""The same three-step workflow on DBOS Transact, for comparison (``pip install -e '.[bench]'``).

Run by ``benchmarks.run`` in a subprocess, so that DBOS's process-global state never mixes
with dex: ``python -m benchmarks.dbos_bench --schema S --runs N`` with the DSN in
``DEX_BENCH_DSN``. DBOS keeps its system tables in schema ``S`` of that database. Workflows go
through a queue with ``worker_concurrency=64`` and a 10 ms polling interval (its fastest
setting here), are enqueued one after the other and then waited for with ``get_result``
(polling every 10 ms too, instead of its default 1 s).

Prints one JSON line; ``xacts_before`` is the server's transaction counter just before the
throughput batch, which the parent compares with the counter after this process exited.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

# the queue's polling interval, and how often get_result looks (its default is 1 s, which would
# add up to a second to every latency sample and to the end of the batch)
POLL = 0.01


def sqlalchemy_url(dsn: str) -> str:
    """The DSN as a SQLAlchemy URL with the psycopg 3 driver (what DBOS's config takes)."""
    for scheme in ("postgresql://", "postgres://"):
        if dsn.startswith(scheme):
            return "postgresql+psycopg://" + dsn[len(scheme) :]
    import psycopg
    from sqlalchemy.engine import URL

    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items() if v is not None}
    host: str | None = params.pop("host", None)
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "port", "dbname")}
    if host and str(host).startswith("/"):
        query["host"] = str(host)
        host = None
    url = URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password=params.get("password"),
        host=host,
        port=int(params["port"]) if params.get("port") else None,
        database=params.get("dbname"),
        query=query,
    )
    return url.render_as_string(hide_password=False)


def dbos_app(dsn: str, schema: str, name: str, workflow_name: str | None = None, io: float = 0.0) -> Any:
    """Configure DBOS on ``schema`` and define the benchmark's workflow (three ``@DBOS.step``s:
    x+1, x*2, x-1, each first sleeping ``io`` seconds if given) under ``workflow_name``; return
    the workflow function. Launch is the caller's."""
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": name,
            "system_database_url": sqlalchemy_url(dsn),
            "dbos_system_schema": schema,
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def inc(x: int) -> int:
        if io:
            time.sleep(io)
        return x + 1

    @DBOS.step()
    def double(x: int) -> int:
        if io:
            time.sleep(io)
        return x * 2

    @DBOS.step()
    def dec(x: int) -> int:
        if io:
            time.sleep(io)
        return x - 1

    @DBOS.workflow(name=workflow_name)
    def three(x: int) -> int:
        return dec(double(inc(x)))

    return three


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schema", required=True)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--latency-samples", type=int, default=11)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    dsn = os.environ["DEX_BENCH_DSN"]

    try:
        from dbos import DBOS
    except ImportError:
        print(json.dumps({"skipped": "pip install -e '.[bench]'"}))
        return

    from benchmarks.dex_bench import CpuMeter
    from benchmarks.pg import transactions

    three = dbos_app(dsn, args.schema, "dex-bench")

    launching = time.perf_counter()
    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=64, polling_interval_sec=POLL)
    launch_seconds = time.perf_counter() - launching
    result: dict[str, Any] = {"launch_seconds": launch_seconds}
    try:
        assert queue.enqueue(three, 1).get_result(polling_interval_sec=POLL) == 3  # warm-up
        observed = []
        for i in range(args.latency_samples):
            time.sleep(0.3)
            started = time.perf_counter()
            value = queue.enqueue(three, i).get_result(polling_interval_sec=POLL)
            observed.append(time.perf_counter() - started)
            assert value == (i + 1) * 2 - 1
        if observed:
            result["latency_median"] = statistics.median(observed)
            result["latency_min"] = min(observed)
            result["latency_max"] = max(observed)
        result["xacts_before"] = transactions(dsn, settle=0)
        deadline = time.monotonic() + args.timeout
        cpu = CpuMeter(dsn)
        started = time.perf_counter()
        handles = [queue.enqueue(three, i) for i in range(args.runs)]
        start_seconds = time.perf_counter() - started
        done = 0
        for i, handle in enumerate(handles):
            if time.monotonic() > deadline:
                break
            value = handle.get_result(polling_interval_sec=POLL)
            assert value == (i + 1) * 2 - 1
            done += 1
        seconds = time.perf_counter() - started
        result.update(cpu.stop())
        result.update(
            n=args.runs,
            done=done,
            seconds=seconds,
            start_seconds=start_seconds,
            rate=done / seconds,
            timed_out=done < args.runs,
        )
    finally:
        DBOS.destroy()
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
