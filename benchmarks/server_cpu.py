"""Where the server's CPU goes, statement by statement: ``python -m benchmarks.server_cpu [-n N] [--inline-seconds S]``.

Runs the dex throughput batch (three-activity workflows) on an embedded PostgreSQL with
``log_statement_stats`` on, then reads the server log: PostgreSQL writes, for every message
it executes (parse, bind, execute, simple query), the user and system CPU time the backend
spent on it (``getrusage``). The table sums them per statement text. Unlike the client-side
wall times of ``benchmarks.profile_sql``, these do not include waiting for the client, the
network, locks held by others or the GIL: what the statement costs the server. Logging costs
time itself, so the rate printed is lower than the benchmark's. A tool, not a benchmark part.

Needs the embedded server (its log file sits in its data directory, where this can read
it); with ``DEX_DATABASE_URL`` set it stops and says so.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import psycopg

from benchmarks import pg
from benchmarks.common import table
from benchmarks.profile_sql import statement_label

# one log entry: "<date> <time> UTC [pid] LOG:  EXECUTE MESSAGE STATISTICS", then its DETAIL
# and STATEMENT lines (which carry a timestamp of their own)
_ENTRY = re.compile(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+ \[\d+\] LOG:  )")
_STATS = re.compile(r"LOG:  (?:\w+ MESSAGE|QUERY) STATISTICS")
_USAGE = re.compile(r"([\d.]+) s user, ([\d.]+) s system, ([\d.]+) s elapsed")
_STATEMENT = re.compile(r"STATEMENT:  (.*)", re.S)


def statement_cpu(log_text: str) -> dict[str, tuple[int, float, float]]:
    """Per statement text: (messages, CPU seconds, elapsed seconds) from ``log_statement_stats`` entries."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for entry in _ENTRY.split(log_text):
        if not _STATS.search(entry):
            continue
        usage, statement = _USAGE.search(entry), _STATEMENT.search(entry)
        if usage is None:
            continue
        total = totals[statement_label(statement.group(1)) if statement else "?"]
        total[0] += 1
        total[1] += float(usage.group(1)) + float(usage.group(2))
        total[2] += float(usage.group(3))
    return {text: (int(n), cpu, elapsed) for text, (n, cpu, elapsed) in totals.items()}


def _log_file(dsn: str) -> Path:
    host = psycopg.conninfo.conninfo_to_dict(dsn).get("host") or ""
    log = Path(str(host)) / "log"
    if not log.is_file():
        sys.exit(f"no server log at {log}, where pgserver keeps it in its data directory")
    return log


def _set_stats(dsn: str, on: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement_stats = on" if on else "ALTER SYSTEM RESET log_statement_stats")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.2)  # backends read the new setting at their next command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="workflows in the batch (default 2000)")
    parser.add_argument(
        "--inline-seconds",
        type=float,
        default=None,
        help="the engine's inline_activity_seconds (0: every activity a task of its own; default: the engine's)",
    )
    args = parser.parse_args()
    if os.environ.get(pg.ENV_VAR):
        sys.exit(f"{pg.ENV_VAR} is set: this tool needs the embedded server, whose log it reads")
    from benchmarks import dex_bench

    dsn, _where = pg.server_dsn()
    log = _log_file(dsn)
    options = {} if args.inline_seconds is None else {"inline_activity_seconds": args.inline_seconds}
    with (
        dex_bench.fresh_schema(dsn, "bench_cpu") as schema,
        dex_bench.engine_on(dsn, schema, **options) as (engine, _s),
    ):
        dex_bench.run_batch(engine, 20, timeout=60, offset=10_000_000)
        offset = log.stat().st_size
        _set_stats(dsn, True)
        try:
            batch = dex_bench.run_batch(engine, args.n, timeout=600)
        finally:
            _set_stats(dsn, False)
    with log.open(errors="replace") as handle:
        handle.seek(offset)
        totals = statement_cpu(handle.read())
    done = max(batch["done"], 1)
    cpu = sum(c for _n, c, _e in totals.values())
    rows = [
        [text, n / done, c * 1000 / done, f"{c / cpu:.1%}", e * 1000 / done]
        for text, (n, c, e) in sorted(totals.items(), key=lambda item: -item[1][1])
        if c > 0
    ]
    print(
        f"{batch['done']} workflows, {batch['rate']:.0f}/s (with the logging); "
        f"server CPU {cpu * 1000 / done:.2f} ms per workflow in statements\n"
    )
    print(
        table(
            "server CPU by statement (parse, bind and execute messages summed)",
            ["statement", "messages/workflow", "CPU ms/workflow", "share", "elapsed ms/workflow"],
            rows[:25],
        )
    )


if __name__ == "__main__":
    main()
