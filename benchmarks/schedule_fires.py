"""Database work per schedule fire with 1, 10 and 50 engines on one database.

    python -m benchmarks.schedule_fires [--engines 1 10 50] [--seconds 20]

Each engine has its own adapter (its own pool) over one schema and declares the same
schedule, every second. One thread runs what ``Background.schedule_round`` does for
schedules, for every engine in turn, every 0.1 s: the leader election's step, then, on the
leader only, ``ScheduleRunner.step()``. (The rest of a round — task scheduling, claims — is
not work per fire, and is left out, as are workflow workers: the runs started are counted,
not run.) Counted per fire: the port calls the schedule runners made (each is one
statement, but ``advance_schedule`` with a start: an UPDATE and the ``create_run`` call in
one transaction), and the rows written and tuples read in the schema's tables
(``pg_stat_user_tables``; pg_stat_statements is not assumed). The leader election's own
statements are reported apart: every engine renews or tries the lease, schedules or not.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.pg import fresh_schema, postgres_dsn

RUNNER_CALLS = ("due_schedules", "advance_schedule", "get_run", "request_transition")


@dex.workflow
async def tick(ctx: dex.WorkflowContext) -> None:
    return None


def counting(adapter: PostgresAdapter, counts: Counter[str]) -> None:
    """Count the calls of the runner's port methods and of try_lead on this adapter."""
    for name in (*RUNNER_CALLS, "try_lead"):
        method: Callable[..., Any] = getattr(adapter, name)

        @functools.wraps(method)
        def counted(*args: Any, _method: Callable[..., Any] = method, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _method(*args, **kwargs)

        setattr(adapter, name, counted)


def table_stats(dsn: str, schema: str) -> dict[str, tuple[int, int]]:
    """Per table of the schema: (rows inserted + updated + deleted, tuples read)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del,"
            " coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_user_tables WHERE schemaname = %s",
            [schema],
        ).fetchall()
    return {str(name): (int(written), int(read)) for name, written, read in rows}


def fires(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {s}.runs WHERE instance_id LIKE 'schedule:tick:%'").format(
                s=sql.Identifier(schema)
            )
        ).fetchone()
    return int(row[0]) if row else 0


def measure(dsn: str, engines: int, seconds: float) -> dict[str, float]:
    schedule = dex.Schedule("tick", tick, every=timedelta(seconds=1), overlap="allow_all")
    with fresh_schema(dsn) as schema:
        counts: Counter[str] = Counter()
        adapters, fleet = [], []
        for i in range(engines):
            adapter = PostgresAdapter(dsn, schema=schema, min_connections=1, max_connections=1)
            adapters.append(adapter)
            fleet.append(dex.Engine(adapter, workflows=[tick], schedules=[schedule], node_id=f"n{i}"))
        for adapter in adapters:
            counting(adapter, counts)
        time.sleep(3)  # the statistics of the set-up reach pg_stat
        before, fired_before = table_stats(dsn, schema), fires(dsn, schema)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for engine in fleet:
                if engine.leader.step():
                    engine.schedules.step()
            time.sleep(0.1)
        time.sleep(3)  # every backend reports its counts (at most once a second, when idle)
        after, fired = table_stats(dsn, schema), fires(dsn, schema) - fired_before
        for engine in fleet:
            engine.leader.release()
        for adapter in adapters:
            adapter.close()
    written = {t: after[t][0] - before.get(t, (0, 0))[0] for t in after}
    read = {t: after[t][1] - before.get(t, (0, 0))[1] for t in after}
    runner_calls = sum(counts[name] for name in RUNNER_CALLS)
    return {
        "engines": engines,
        "fires": fired,
        "runner calls / fire": runner_calls / fired,
        "advance / fire": counts["advance_schedule"] / fired,
        "due reads / fire": counts["due_schedules"] / fired,
        "schedules rows written / fire": written.get("schedules", 0) / fired,
        "rows written / fire (all tables, leader table excluded)": sum(v for t, v in written.items() if t != "leader")
        / fired,
        "tuples read / fire (schedules)": read.get("schedules", 0) / fired,
        "lease calls / s (all engines)": counts["try_lead"] / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    dsn = postgres_dsn()
    results = [measure(dsn, n, args.seconds) for n in args.engines]
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for result in results:
        print(
            "| "
            + " | ".join(f"{result[k]:.2f}" if isinstance(result[k], float) else str(result[k]) for k in keys)
            + " |"
        )


if __name__ == "__main__":
    main()
