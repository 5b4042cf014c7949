"""A queue's key concurrency and rate limit across engine processes on one database
(docs/reference/contract.md §15, the queues bullet), checked from the recorded times.

Three worker processes (:mod:`tests.integration.queue_limits_worker`) run tenant jobs on the
workflow queue ``tenants`` (key concurrency 2); each job's activity runs on the activity queue
``api``, limited to 3 starts a second. What must hold, from what the runs recorded:

* at no moment do more than 2 runs of one concurrency key run (between their start and their
  end, as ``get_run`` reports them), and 2 do at some moment (the limit is reached, not
  merely respected by running one at a time);
* no window of a second holds more than 3 activity starts. The times are taken by the
  activity as its attempt begins, a little after its claim took the slot, so the check allows
  that delay (``SLACK``): any 4 consecutive starts span at least a second less the slack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.integration.queue_limits_worker import call_api, tenant_job
from tests.integration.test_processes import REPO, Worker
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres

RATE = (3, timedelta(seconds=1))
SLACK = 0.15  # seconds between a claim and its attempt's first line, at most, on a loaded host
RUNS = {"t1": 8, "t2": 4}


class LimitsWorker(Worker):
    def __init__(self, dsn: str, schema: str, node_id: str, log_dir: Path) -> None:
        self.node_id = node_id
        self.log_path = log_dir / f"{node_id}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.queue_limits_worker", "--dsn", dsn, "--schema", schema,
             "--node-id", node_id],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[str, str, str], Worker]]:
    workers: list[Worker] = []

    def start(dsn: str, schema: str, node_id: str) -> Worker:
        worker = LimitsWorker(dsn, schema, node_id, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.alive():
            worker.process.kill()
        worker.wait(10)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of the spans (start, end) that hold one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same moment
        running += step
        most = max(most, running)
    return most


def test_engines_keep_key_concurrency_and_the_rate_limit(spawn: Callable[[str, str, str], Worker]) -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema)
        engine = dex.Engine(adapter, workflows=[tenant_job], activities=[call_api])
        try:
            engine.create_queue("tenants", "workflow", 100, key_concurrency=2)
            engine.create_queue("api", "activity", 100, rate_limit=RATE)
            workers = [spawn(dsn, schema, f"q{i}") for i in range(3)]
            for worker in workers:
                worker.wait_ready()
            run_ids = {
                key: [engine.start_workflow(tenant_job, n, concurrency_key=key) for n in range(count)]
                for key, count in RUNS.items()
            }
            began = sorted(engine.wait(run_id, timeout=60) for ids in run_ids.values() for run_id in ids)
            for key, ids in run_ids.items():
                runs = [engine.get_run(run_id) for run_id in ids]
                spans = [(r.started_at.timestamp(), r.completed_at.timestamp()) for r in runs]  # type: ignore[union-attr]
                assert most_at_once(spans) == 2, (key, spans)
            n, period = RATE
            gaps = [later - first for first, later in zip(began, began[n:], strict=False)]
            assert min(gaps) >= period.total_seconds() - SLACK, gaps
            # the limit paced them: 12 starts at 3 a second take at least 3 s
            assert began[-1] - began[0] >= (len(began) / n - 1) * period.total_seconds() - SLACK
            for worker in workers:
                worker.signal(signal.SIGTERM)
            for worker in workers:
                assert worker.wait(30) == 0, worker.output()
        finally:
            engine.stop(timeout=5)
            adapter.close()
