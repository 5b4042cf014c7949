"""Where the runs of an I/O-bound batch wait: the task tables and the engine sampled every 20 ms.

    PYTHONPATH=. .venv/bin/python -m benchmarks.occupancy -n 1000 [--activity-capacity 1000]

One started engine with default settings runs ``-n`` 3 × 20 ms I/O workflows (``io_three``),
started one after the other; a second connection counts, every 20 ms, the activity tasks
waiting for room in their queue (CREATED), claimable and not claimed, and claimed (an attempt
running, or finished and not yet written), and the workflow tasks; the engine's coordinator
says how many attempts its pool runs. A queue's capacity counts its claimable and claimed
tasks, so claimed tasks whose attempts have ended hold room until their outcome is written.
A tool, not a benchmark: it prints means, medians and maxima of one batch.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psycopg

import dex
from benchmarks import pg, workloads
from dex.adapters.postgres import PostgresAdapter

COLUMNS = ("activity tasks waiting for room", "claimable, not claimed", "claimed", "workflow tasks", "attempts running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--activity-capacity", type=int, default=0, help="set the activity queue's capacity first")
    args = parser.parse_args()
    dsn, _where = pg.server_dsn()
    schema = pg.new_schema("occupancy")
    adapter = PostgresAdapter(dsn, schema=schema)
    engine = dex.Engine(adapter, workflows=workloads.WORKFLOWS, activities=workloads.ACTIVITIES)
    if args.activity_capacity:
        adapter.ensure_queue("default", "activity")
        adapter.set_queue_capacity("default", "activity", args.activity_capacity)
    engine.start()
    samples: list[tuple[int, ...]] = []
    stop = threading.Event()

    def sample() -> None:
        coordinator = engine._background.coordinator  # a tool may look inside
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    f"""SELECT count(*) FILTER (WHERE state = 'CREATED'),
                               count(*) FILTER (WHERE state = 'QUEUED' AND locked_by IS NULL),
                               count(*) FILTER (WHERE state = 'QUEUED' AND locked_by IS NOT NULL),
                               (SELECT count(*) FROM "{schema}".workflow_tasks)
                        FROM "{schema}".activity_tasks"""
                ).fetchone()
                assert row is not None
                samples.append((*row, len(coordinator.state.running)))
                time.sleep(0.02)

    try:
        for i in range(5):
            engine.wait(engine.start_workflow(workloads.io_three, i), timeout=30)
        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        run_ids = [engine.start_workflow(workloads.io_three, i) for i in range(args.n)]
        for run_id in run_ids:
            engine.wait(run_id, timeout=300)
        seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
    finally:
        stop.set()
        engine.stop()
        adapter.close()
        pg.drop_schema(dsn, schema)
    print(f"{args.n} workflows in {seconds:.2f} s: {args.n / seconds:.0f}/s; {len(samples)} samples")
    for i, name in enumerate(COLUMNS):
        values = [s[i] for s in samples]
        print(
            f"  {name:34} mean {statistics.mean(values):6.1f}  median {statistics.median(values):5.0f}  max {max(values)}"
        )


if __name__ == "__main__":
    main()
