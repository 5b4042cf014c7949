"""What bounds a batch of I/O-bound workflows in one process (a tool, not a benchmark).

``PYTHONPATH=. python -m benchmarks.io_batch [-n 1000] [--concurrency C]`` starts ``n``
workflows of three activities that each sleep 20 ms (``benchmarks.workloads.io_three``) on a
started engine, one after the other, then waits for each; it prints the rate, the port calls
per workflow with their wall time per call (each is one transaction or statement: a lane's
flusher busy most of the batch shows as calls × ms/call near the batch's length), and the CPU
each of the engine's threads used per workflow (``/proc/self/task/<tid>/stat``; Linux only).
PostgreSQL as ``benchmarks.run`` finds it.
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
from typing import Any

from benchmarks import pg, workloads
from benchmarks.dex_bench import engine_on, fresh_schema


def thread_cpu_ms() -> collections.Counter[str]:
    """CPU milliseconds of this process's live threads so far, by name (activity threads as one)."""
    ticks = 1000 / 100  # USER_HZ: /proc counts in hundredths of a second on Linux
    used: collections.Counter[str] = collections.Counter()
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        name = "dex-activity_*" if thread.name.startswith("dex-activity_") else thread.name
        used[name] += int((int(fields[11]) + int(fields[12])) * ticks)
    return used


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.io_batch")
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=None, help="activity threads (the engine's default)")
    args = parser.parse_args()
    dsn, _where = pg.server_dsn()
    options: dict[str, Any] = {} if args.concurrency is None else {"activity_concurrency": args.concurrency}
    n = args.n
    with fresh_schema(dsn, "bench_io_batch") as schema, engine_on(dsn, schema, **options) as (engine, stats):
        for i in range(20):  # warm-up: connections, prepared statements, activity durations
            engine.wait(engine.start_workflow(workloads.io_three, 10_000_000 + i), timeout=60)
        before = thread_cpu_ms()
        stats.reset()
        cpu, started = time.process_time(), time.perf_counter()
        run_ids = [engine.start_workflow(workloads.io_three, i) for i in range(n)]
        for i, run_id in enumerate(run_ids):
            assert engine.wait(run_id, timeout=120) == workloads.expected_three(i)
        seconds = time.perf_counter() - started
        after = thread_cpu_ms()
        calls = stats.snapshot()
    print(
        f"{n} workflows in {seconds:.2f} s: {n / seconds:.0f}/s; process CPU {(time.process_time() - cpu) * 1000 / n:.2f} ms/workflow"
    )
    print("port calls: calls/workflow, ms/call, seconds in all")
    for name, (count, total) in sorted(calls.items(), key=lambda item: -item[1][1]):
        print(f"  {name:<38} {count / n:6.2f} {total * 1000 / count:7.2f} {total:6.2f}")
    print("CPU ms/workflow by thread")
    for name in sorted(after, key=lambda k: -(after[k] - before.get(k, 0))):
        if after[name] - before.get(name, 0) > 0:
            print(f"  {name:<38} {(after[name] - before.get(name, 0)) / n:6.2f}")


if __name__ == "__main__":
    main()
