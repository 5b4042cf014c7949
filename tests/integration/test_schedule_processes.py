"""Schedules across engine processes on one database (docs/reference/contract.md §10): at most one run per fire.

Several worker processes (:mod:`tests.integration.schedule_worker`) declare the same
schedule, every second; some are killed with SIGKILL (the leader among them) and restarted.
What must hold: no fire time starts two runs, and none is lost (the catch-up window is an
hour, longer than any gap here), so the fire times of the runs are every second from the
first fire to the last. The short default runs about 15 s; ``-m slow`` runs a longer one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.integration.test_processes import REPO, Worker
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres


class ScheduleWorker(Worker):
    """A worker process running :mod:`tests.integration.schedule_worker`."""

    def __init__(self, dsn: str, schema: str, node_id: str, log_dir: Path) -> None:
        self.node_id = node_id
        self.log_path = log_dir / f"{node_id}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.schedule_worker", "--dsn", dsn, "--schema", schema,
             "--node-id", node_id, "--every", "1"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(dsn: str, schema: str, node_id: str) -> Worker:
        worker = ScheduleWorker(dsn, schema, node_id, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.alive():
            worker.process.kill()
        worker.wait(10)


def fire_times(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT instance_id FROM {s}.runs WHERE instance_id LIKE 'schedule:tick:%'").format(
                s=sql.Identifier(schema)
            )
        ).fetchall()
    return [str(row[0]) for row in rows]


def leader_node(dsn: str, schema: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT node_id FROM {s}.leader").format(s=sql.Identifier(schema))).fetchone()
    return str(row[0]) if row is not None else None


def check(instance_ids: list[str]) -> list[datetime]:
    twice = [i for i, n in Counter(instance_ids).items() if n > 1]
    assert twice == [], f"fires started twice: {twice}"
    times = sorted(datetime.strptime(i[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for i in instance_ids)
    expected = [times[0] + timedelta(seconds=k) for k in range(len(times))]
    missing = sorted(set(expected) - set(times))
    assert times == expected, f"fires lost: {missing[:10]}"
    return times


def run_cluster(spawn: Callable[..., Worker], seconds: float, processes: int, seed: int) -> None:
    dsn = postgres_dsn()
    rng = random.Random(seed)
    with fresh_schema(dsn) as schema:
        workers = [spawn(dsn, schema, f"s{i}") for i in range(processes)]
        for worker in workers:
            worker.wait_ready()
        deadline = time.monotonic() + seconds
        restarts = leaders_killed = 0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 3.0))
            victim = rng.randrange(len(workers))
            if restarts % 2 == 0:  # every other kill takes the leader, mid-lease
                leader = leader_node(dsn, schema)
                victim = next((i for i, w in enumerate(workers) if w.node_id == leader), victim)
                leaders_killed += leader is not None and workers[victim].node_id == leader
            workers[victim].process.send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            time.sleep(rng.uniform(0, 1.5))
            restarts += 1
            workers[victim] = spawn(dsn, schema, f"s{victim}-r{restarts}")
            workers[victim].wait_ready()
        time.sleep(4)  # the last leader change settles: its fires are caught up
        before = len(fire_times(dsn, schema))
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(30) == 0, worker.output()
        times = check(fire_times(dsn, schema))
        assert restarts >= 2 and leaders_killed >= 1
        assert len(times) >= before >= seconds * 0.5, f"only {len(times)} fires in {seconds} s"


def test_killed_and_restarted_engines_start_each_fire_once(spawn: Callable[..., Worker]) -> None:
    run_cluster(spawn, seconds=12, processes=3, seed=1)


@pytest.mark.slow
def test_killed_and_restarted_engines_start_each_fire_once_for_longer(spawn: Callable[..., Worker]) -> None:
    run_cluster(spawn, seconds=60, processes=4, seed=2)
