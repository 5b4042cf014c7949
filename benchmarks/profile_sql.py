"""Where dex's throughput goes, statement by statement: ``python -m benchmarks.profile_sql [-n N]``.

Runs the dex throughput batch (three-activity workflows) with psycopg's ``Cursor.execute``
and the connection's BEGIN/COMMIT wrapped, and prints, per SQL statement: round trips per
workflow, mean wall time and share of the total. A tool for finding what to optimise, not a
benchmark: the wrapping costs a little time itself.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from benchmarks import pg
from benchmarks.common import table

_lock = threading.Lock()
_calls: dict[str, int] = defaultdict(int)
_seconds: dict[str, float] = defaultdict(float)
_enabled = False


def _label(query: Any, conn: Any) -> str:
    if isinstance(query, sql.Composable):
        try:
            text = query.as_string(conn)
        except Exception:  # noqa: BLE001
            text = repr(query)
    elif isinstance(query, bytes):
        text = query.decode(errors="replace")
    else:
        text = str(query)
    return statement_label(text)


def statement_label(text: str) -> str:
    """A statement's text on one line, without the benchmark's schema name, cut at 110 characters."""
    text = re.sub(r'"bench_[a-z]+_[0-9a-f]+"\.', "", text)
    return re.sub(r"\s+", " ", text).strip()[:110]


def _record(label: str, started: float) -> None:
    elapsed = time.perf_counter() - started
    with _lock:
        _calls[label] += 1
        _seconds[label] += elapsed


def install() -> None:
    """Wrap Cursor.execute and the transaction commands BEGIN / COMMIT / ROLLBACK."""
    original_execute: Callable[..., Any] = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if not _enabled:
            return original_execute(self, query, *args, **kwargs)
        started = time.perf_counter()
        try:
            return original_execute(self, query, *args, **kwargs)
        finally:
            _record(_label(query, self.connection), started)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]

    from psycopg._connection_base import BaseConnection

    original_exec = BaseConnection._exec_command

    def exec_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:  # a generator in psycopg
        if not _enabled:
            return (yield from original_exec(self, command, *args, **kwargs))
        started = time.perf_counter()
        try:
            return (yield from original_exec(self, command, *args, **kwargs))
        finally:
            _record("<" + _label(command, None) + ">", started)

    BaseConnection._exec_command = exec_command  # type: ignore[method-assign,assignment]


def main() -> None:
    global _enabled
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=1000)
    args = parser.parse_args()
    install()
    from benchmarks import dex_bench

    dsn, _where = pg.server_dsn()
    with dex_bench.fresh_schema(dsn, "bench_prof") as schema, dex_bench.engine_on(dsn, schema) as (engine, _s):
        dex_bench.run_batch(engine, 20, timeout=60, offset=10_000_000)
        time.sleep(0.2)
        _enabled = True
        batch = dex_bench.run_batch(engine, args.n, timeout=600)
        _enabled = False
    done = max(batch["done"], 1)
    total = sum(_seconds.values())
    rows = [
        [label, _calls[label] / done, _seconds[label] * 1000 / _calls[label], f"{_seconds[label] / total:.1%}"]
        for label in sorted(_calls, key=lambda k: -_seconds[k])
    ]
    print(
        f"{batch['done']} workflows, {batch['rate']:.0f}/s (with the wrapping); "
        f"{sum(_calls.values()) / done:.1f} round trips per workflow\n"
    )
    print(table("statements, by total wall time", ["statement", "per workflow", "ms each", "share"], rows))


if __name__ == "__main__":
    main()
