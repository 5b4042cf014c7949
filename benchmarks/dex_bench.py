"""The dex side of the benchmarks: throughput, idle latency, scale curves.

Everything goes through the public API (``dex.Engine``, ``start_workflow``, ``wait``) on a
``PostgresAdapter`` with a fresh schema per part. The adapter's port methods are wrapped to
count calls and time them (each port call is one transaction, so the counts break the
server's transaction figure down by operation); the wrapping changes no behaviour.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg

import dex
from benchmarks import pg
from benchmarks.workloads import ACTIVITIES, WORKFLOWS, chain, expected_three, three, waiter
from dex.adapters.postgres import PostgresAdapter

_NOT_PORTS = {"close", "clock", "schema"}


@attrs.define
class PortStats:
    """Calls and wall time per adapter method (thread-safe)."""

    calls: dict[str, int] = attrs.field(factory=dict)
    seconds: dict[str, float] = attrs.field(factory=dict)
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.seconds.clear()

    def snapshot(self) -> dict[str, tuple[int, float]]:
        with self.lock:
            return {name: (self.calls[name], self.seconds[name]) for name in self.calls}

    def total_calls(self) -> int:
        with self.lock:
            return sum(self.calls.values())


def instrument(adapter: Any) -> PortStats:
    """Wrap every public method of ``adapter`` (on the instance) to count and time its calls."""
    stats = PortStats()
    for name in dir(type(adapter)):
        if name.startswith("_") or name in _NOT_PORTS:
            continue
        if isinstance(getattr(type(adapter), name, None), property):
            continue
        method = getattr(adapter, name)
        if not callable(method):
            continue
        setattr(adapter, name, _counted(stats, name, method))
    return stats


def _counted(stats: PortStats, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            with stats.lock:
                stats.calls[name] = stats.calls.get(name, 0) + 1
                stats.seconds[name] = stats.seconds.get(name, 0.0) + elapsed

    return wrapper


@contextmanager
def engine_on(dsn: str, schema: str, **engine_kwargs: Any) -> Iterator[tuple[dex.Engine, PortStats]]:
    """A started engine (all benchmark workflows registered) on ``schema``; stopped and closed after."""
    adapter = PostgresAdapter(dsn, schema=schema)
    stats = instrument(adapter)
    engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES, **engine_kwargs)
    engine.start()
    try:
        yield engine, stats
    finally:
        try:
            engine.stop()
        finally:
            adapter.close()


@contextmanager
def fresh_schema(dsn: str, prefix: str) -> Iterator[str]:
    schema = pg.new_schema(prefix)
    try:
        yield schema
    finally:
        pg.drop_schema(dsn, schema)


def _postmaster(dsn: str) -> Any | None:
    """The postmaster of the embedded server behind ``dsn`` (psutil), or None.

    Found by the socket directory, which pgserver makes the data directory; None for a server
    elsewhere (DEX_DATABASE_URL) or without psutil.
    """
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        host = str(psycopg.conninfo.conninfo_to_dict(dsn).get("host") or "")
    except psycopg.ProgrammingError:
        return None
    if not host.startswith("/"):
        return None
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if (
            proc.info.get("name") in ("postgres", "postmaster")
            and "-D" in cmdline[:-1]
            and os.path.realpath(cmdline[cmdline.index("-D") + 1]) == os.path.realpath(host)
        ):
            return proc
    return None


def _server_cpu(postmaster: Any) -> float:
    """CPU seconds of the server so far: the postmaster, its live children, and (through the
    postmaster's children times) the backends that have exited and been reaped."""
    total = 0.0
    try:
        cpu = postmaster.cpu_times()
        total += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        children = postmaster.children(recursive=True)
    except Exception:  # noqa: BLE001 - the server went away
        return total
    for child in children:
        with contextlib.suppress(Exception):  # a backend that exited meanwhile
            cpu = child.cpu_times()
            total += cpu.user + cpu.system
    return total


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class CpuMeter:
    """CPU seconds used by this process, by the benchmark's PostgreSQL and by everything else.

    "Everything else" (other processes on the machine) is the machine's busy time less the
    other two: on a shared machine it says how much the figures were disturbed.
    """

    def __init__(self, dsn: str) -> None:
        self._postmaster = _postmaster(dsn)
        self._ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cores = os.cpu_count() or 1
        self._wall = time.perf_counter()
        self._start = self._read()

    def _read(self) -> tuple[float, float, int, int]:
        times = os.times()
        server = _server_cpu(self._postmaster) if self._postmaster is not None else 0.0
        busy, total = _machine_ticks()
        return times.user + times.system, server, busy, total

    def stop(self) -> dict[str, float | None]:
        client, server, busy, _total = self._read()
        client -= self._start[0]
        server -= self._start[1]
        machine_busy = (busy - self._start[2]) / self._ticks_per_second
        wall = time.perf_counter() - self._wall
        known = self._postmaster is not None
        other = machine_busy - client - (server if known else 0.0)
        return {
            "client_cpu_seconds": client,
            "server_cpu_seconds": server if known else None,
            "other_cpu_share": max(0.0, other) / (wall * self._cores) if known and wall > 0 else None,
        }


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


def run_batch(engine: dex.Engine, n: int, timeout: float, offset: int = 0) -> dict[str, Any]:
    """Start ``n`` three-activity workflows, then wait for every one; time both."""
    deadline = Deadline(timeout)
    started = time.perf_counter()
    run_ids = [engine.start_workflow(three, offset + i) for i in range(n)]
    start_seconds = time.perf_counter() - started
    done = wait_all(engine, run_ids, deadline, offset)
    return batch_result(n, done, time.perf_counter() - started, start_seconds)


def batch_result(n: int, done: int, seconds: float, start_seconds: float) -> dict[str, Any]:
    """The figures of a batch of ``n`` starts of which ``done`` finished in ``seconds``."""
    return {
        "n": n,
        "done": done,
        "seconds": seconds,
        "start_seconds": start_seconds,
        "rate": done / seconds if seconds > 0 else 0.0,
        "timed_out": done < n,
    }


def wait_all(engine: dex.Engine, run_ids: list[str], deadline: Deadline, offset: int = 0) -> int:
    """Wait for each run in turn and check its result; return how many finished in time."""
    done = 0
    for i, run_id in enumerate(run_ids):
        try:
            result = engine.wait(run_id, timeout=deadline.left())
        except TimeoutError:
            break
        if result != expected_three(offset + i):
            raise AssertionError(f"run {run_id}: got {result!r}, expected {expected_three(offset + i)}")
        done += 1
    return done


# -- (a) throughput -----------------------------------------------------------------------------
def throughput(dsn: str, n: int, timeout: float, warmup: int = 20) -> dict[str, Any]:
    """N three-activity workflows; rate, and transactions per workflow (server and per port)."""
    with fresh_schema(dsn, "bench_tp") as schema:
        with engine_on(dsn, schema) as (engine, stats):
            run_batch(engine, warmup, timeout=60, offset=10_000_000)
            time.sleep(0.2)
            stats.reset()
            before = pg.transactions(dsn, settle=0)
            cpu = CpuMeter(dsn)
            batch = run_batch(engine, n, timeout)
            batch.update(cpu.stop())
            ports = stats.snapshot()
        after = pg.transactions(dsn)  # the engine stopped and its connections closed: counters flushed
    done = max(batch["done"], 1)
    batch["xacts_server"] = after - before
    batch["xacts_per_workflow"] = (after - before) / done
    batch["port_calls"] = {name: calls for name, (calls, _s) in ports.items()}
    batch["port_seconds"] = {name: s for name, (_c, s) in ports.items()}
    batch["port_calls_per_workflow"] = sum(c for c, _ in ports.values()) / done
    return batch


def engine_alone(dsn: str, n: int, timeout: float) -> dict[str, Any]:
    """The engine's own rate: ``n`` runs created while it is stopped (that loop's rate is
    ``starts_rate``), then ``engine.start()`` → the last result. Nothing else runs in the process meanwhile (in the batch above, the
    sequential ``start_workflow`` loop shares the two cores and the GIL with the engine)."""
    with fresh_schema(dsn, "bench_alone") as schema:
        adapter = PostgresAdapter(dsn, schema=schema)
        engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        try:
            creating = time.perf_counter()
            run_ids = [engine.start_workflow(three, i) for i in range(n)]
            start_seconds = time.perf_counter() - creating
            deadline = Deadline(timeout)
            started = time.perf_counter()
            engine.start()
            done = wait_all(engine, run_ids, deadline)
            seconds = time.perf_counter() - started
        finally:
            engine.stop()
            adapter.close()
    return {
        "n": n,
        "done": done,
        "seconds": seconds,
        "rate": done / seconds if seconds > 0 else 0.0,
        # the same loop of starts as the batch's, with no engine running beside it: a ceiling
        # for any in-process batch started one run after another (BENCHMARKS.md, "What bounds the batches")
        "starts_rate": n / start_seconds if start_seconds > 0 else 0.0,
    }


# -- idle latency -------------------------------------------------------------------------------
def latency(dsn: str, samples: int, pause: float = 0.3) -> dict[str, Any]:
    """One workflow alone, start to result, ``samples`` times on an otherwise idle engine."""
    observed: list[float] = []
    inside: list[float] = []
    with fresh_schema(dsn, "bench_lat") as schema, engine_on(dsn, schema) as (engine, _stats):
        engine.wait(engine.start_workflow(three, 0), timeout=30)  # warm-up: queues, prepared statements
        cpu = CpuMeter(dsn)
        for i in range(samples):
            time.sleep(pause)  # let every poller go idle
            started = time.perf_counter()
            run_id = engine.start_workflow(three, i)
            result = engine.wait(run_id, timeout=30)
            observed.append(time.perf_counter() - started)
            assert result == expected_three(i)
            info = engine.get_run(run_id)
            if info.completed_at is not None:
                inside.append((info.completed_at - info.created_at).total_seconds())
    return {
        **cpu.stop(),
        "samples": samples,
        "median": statistics.median(observed),
        "min": min(observed),
        "max": max(observed),
        "p90": sorted(observed)[max(0, int(len(observed) * 0.9) - 1)],
        "engine_median": statistics.median(inside) if inside else None,
    }


# -- scale: waiting and finished runs in the tables ----------------------------------------------
def _settle(engine: dex.Engine, run_id: str, kind: str, timeout: float = 60) -> None:
    """Wait until the run's history holds an event of ``kind`` and its workflow task is done."""
    deadline = Deadline(timeout)
    while deadline.left() > 0:
        kinds = [event.kind for event in engine.history(run_id)]
        if kind in kinds and kinds[-1] == "WorkflowTaskCompleted":
            return
        time.sleep(0.05)
    raise TimeoutError(f"run {run_id} did not reach {kind}")


def with_background(dsn: str, waiting: int, finished: int, n: int, timeout: float) -> dict[str, Any]:
    """Throughput of ``n`` workflows with ``waiting`` runs on a far timer and ``finished`` runs
    already in the tables (copies of a template run made by the engine, inserted in SQL)."""
    with fresh_schema(dsn, "bench_scale") as schema:
        seeding = time.perf_counter()
        with engine_on(dsn, schema) as (engine, _stats):
            waiting_template = engine.start_workflow(waiter, 1)
            finished_template = engine.start_workflow(three, 1)
            engine.wait(finished_template, timeout=60)
            _settle(engine, waiting_template, "TimerCreated")
        if waiting > 1:
            pg.clone_run(dsn, schema, waiting_template, waiting - 1)
        if finished > 1:
            pg.clone_run(dsn, schema, finished_template, finished - 1)
        seed_seconds = time.perf_counter() - seeding
        rows = pg.table_sizes(dsn, schema)
        with engine_on(dsn, schema) as (engine, stats):
            run_batch(engine, 20, timeout=60, offset=10_000_000)
            stats.reset()
            cpu = CpuMeter(dsn)
            batch = run_batch(engine, n, timeout)
            batch.update(cpu.stop())
            ports = stats.snapshot()
    batch.update(waiting=waiting, finished=finished, seed_seconds=seed_seconds, rows=rows)
    batch["port_seconds"] = {name: s for name, (_c, s) in ports.items()}
    batch["port_calls"] = {name: c for name, (c, _s) in ports.items()}
    return batch


# -- scale: long histories ------------------------------------------------------------------------
def chains(dsn: str, lengths: list[int], timeout: float) -> list[dict[str, Any]]:
    """Start to result of one workflow of n sequential activities, for each n (alone)."""
    results: list[dict[str, Any]] = []
    deadline = Deadline(timeout)
    with fresh_schema(dsn, "bench_chain") as schema, engine_on(dsn, schema) as (engine, stats):
        engine.wait(engine.start_workflow(chain, 2), timeout=30)
        for n in lengths:
            stats.reset()
            cpu = CpuMeter(dsn)
            started = time.perf_counter()
            run_id = engine.start_workflow(chain, n)
            try:
                result = engine.wait(run_id, timeout=deadline.left())
            except TimeoutError:
                results.append({"activities": n, "seconds": None, "timed_out": True})
                engine.cancel(run_id)
                break
            seconds = time.perf_counter() - started
            assert result == n
            ports = stats.snapshot()
            results.append(
                {
                    **cpu.stop(),
                    "activities": n,
                    "seconds": seconds,
                    "ms_per_activity": seconds * 1000 / n,
                    "history_events": len(engine.history(run_id)),
                    "port_seconds": {name: s for name, (_c, s) in ports.items()},
                    "port_calls": {name: c for name, (c, _s) in ports.items()},
                    "timed_out": False,
                }
            )
    return results
