"""Where a lone workflow's time goes, from ``start_workflow`` to ``wait`` returning (a tool).

``PYTHONPATH=. python -m benchmarks.lone_trace [--samples 20] [--io 0.02] [--inline-seconds X]``
runs the three-activity workflow alone on a started engine (``--io``: each activity sleeps that
long; 0 runs the headline ``x+1, x*2, x-1``), ``--samples`` times, 0.3 s apart, and records
every port call (each one transaction or statement) with its thread, wall time and the
thread's CPU time, and every activity's sleep. For each sample it splits the wall time into:
the activities' I/O; the write transactions on the path (the start, each workflow task's
completion, each activity's completion: they follow one another); claims the workflow worker
made between an activity's completion and the next workflow task's (on the path too); and
the rest (thread hand-offs, the workflow code, ``wait`` noticing the end; ``tail`` is the part
after the last write). Prints the medians,
and one sample's timeline. PostgreSQL as ``benchmarks.run`` finds it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import dex
from benchmarks import pg, workloads
from dex.adapters.postgres import PostgresAdapter

WRITES = (
    "create_run_then_claim",
    "create_run",
    "complete_workflow_tasks_then_claim",
    "complete_workflow_tasks",
    "complete_activity_tasks_then_claim",
    "complete_activity_tasks",
)
Call = tuple[float, float, float, str, str]  # start, end, CPU ms, name, thread


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                call = (started, time.perf_counter(), (time.thread_time() - cpu) * 1000, name, _thread())
                with self.lock:
                    self.calls.append(call)

        return recorded


def _thread() -> str:
    return threading.current_thread().name


def _split(calls: list[Call], t0: float, end: float) -> dict[str, float]:
    calls = sorted(c for c in calls if c[0] < end)
    io = sum(c[1] - c[0] for c in calls if c[3] == "IO")
    writes = sum(c[1] - c[0] for c in calls if c[3] in WRITES)
    claims = 0.0
    for i, c in enumerate(calls):
        # a workflow-task claim between an activity's completion and the next workflow write
        if c[3] == "claim_workflow_tasks":
            before = [p for p in calls[:i] if p[3] in WRITES]
            after = [p for p in calls[i + 1 :] if p[3] in WRITES]
            if before and after and before[-1][3].startswith("complete_activity") and after[0][0] >= c[1]:
                claims += c[1] - c[0]
    total = end - t0
    last = max((c[1] for c in calls if c[3] in WRITES), default=end)
    return {
        "tail": (end - last) * 1000,
        "total": total * 1000,
        "io": io * 1000,
        "writes": writes * 1000,
        "claims": claims * 1000,
        "rest": (total - io - writes - claims) * 1000,
        "write_cpu": sum(c[2] for c in calls if c[3] in WRITES),
        "writes_n": sum(1 for c in calls if c[3] in WRITES),
        "reads_n": sum(1 for c in calls if c[3] in ("get_run", "get_runs")),
        "others_n": sum(1 for c in calls if c[3] not in WRITES and c[3] != "IO"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lone_trace")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--io", type=float, default=0.02)
    parser.add_argument("--inline-seconds", type=float, default=None)
    args = parser.parse_args()
    dsn, _where = pg.server_dsn()
    schema = pg.new_schema("bench_lone")
    recorder = Recorder()
    adapter = PostgresAdapter(dsn, schema=schema)
    for name in dir(type(adapter)):
        if name.startswith("_") or name in ("close", "clock", "schema"):
            continue
        if isinstance(getattr(type(adapter), name, None), property) or not callable(getattr(adapter, name)):
            continue
        setattr(adapter, name, recorder.wrap(name, getattr(adapter, name)))
    workloads.IO_SECONDS = 0.0
    if args.io:
        pause = args.io
        workloads.IO_SECONDS = 0.0

        def io_only() -> None:
            started = time.perf_counter()
            time.sleep(pause)
            with recorder.lock:
                recorder.calls.append((started, time.perf_counter(), 0.0, "IO", _thread()))

        workloads._work = io_only  # the activities look it up at each call
    workflow = workloads.io_three if args.io else workloads.three
    options = {} if args.inline_seconds is None else {"inline_activity_seconds": args.inline_seconds}
    engine = dex.Engine(adapter, workflows=workloads.WORKFLOWS, activities=workloads.ACTIVITIES, **options)
    engine.start()
    splits: list[dict[str, float]] = []
    per_call: dict[str, list[tuple[float, float]]] = {}
    timeline: list[str] = []
    try:
        for i in range(5):
            engine.wait(engine.start_workflow(workflow, i), timeout=30)
        for i in range(args.samples):
            time.sleep(0.3)
            with recorder.lock:
                recorder.calls.clear()
            t0 = time.perf_counter()
            assert engine.wait(engine.start_workflow(workflow, i), timeout=30) == workloads.expected_three(i)
            end = time.perf_counter()
            with recorder.lock:
                calls = list(recorder.calls)
            splits.append(_split(calls, t0, end))
            for s, e, cpu, name, _th in calls:
                if s < end and name != "IO":
                    per_call.setdefault(name, []).append(((e - s) * 1000, cpu))
            if i == args.samples // 2:
                timeline = [
                    f"{(s - t0) * 1000:7.1f} {(e - t0) * 1000:7.1f} {(e - s) * 1000:5.1f} {cpu:5.1f}  {name:<38} {th}"
                    for s, e, cpu, name, th in sorted(calls)
                    if s < end
                ]
    finally:
        engine.stop()
        adapter.close()
        pg.drop_schema(dsn, schema)
    print(f"{args.samples} samples, io {args.io * 1000:.0f} ms per activity; medians (ms):")
    for key in ("total", "io", "writes", "claims", "rest", "tail", "write_cpu", "writes_n", "reads_n", "others_n"):
        values = [s[key] for s in splits]
        print(f"  {key:<10} {statistics.median(values):7.1f}   (min {min(values):.1f}, max {max(values):.1f})")
    print("\nper port call: calls per sample, median wall ms, median CPU ms of its thread")
    for name, pairs in sorted(per_call.items(), key=lambda item: -sum(w for w, _c in item[1])):
        walls, cpus = [w for w, _c in pairs], [c for _w, c in pairs]
        print(
            f"  {name:<38} {len(pairs) / args.samples:5.2f} {statistics.median(walls):6.2f} {statistics.median(cpus):6.2f}"
        )
    print("\none sample: start, end, wall ms, thread CPU ms, port call, thread")
    print("\n".join(timeline))


if __name__ == "__main__":
    main()
