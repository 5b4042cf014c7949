"""Exactly once under SIGKILL (docs/reference/contract.md §9): worker processes are killed every second or two while
runs of several transaction steps insert rows into a table without a unique constraint; at the
end every run has completed and the table holds exactly one row per step per run.

A kill before a step's commit leaves nothing (the server rolls the dead session back) and the
step runs again elsewhere once its lease lapses; a kill after it can only lose the worker's
in-memory state, never make the step run again: its task row went with the commit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.integration import tx_workload
from tests.pg import fresh_schema

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[2]


class Workers:
    """Worker processes of the workload; their output goes to files in ``log_dir``."""

    def __init__(self, dsn: str, schema: str, log_dir: Path) -> None:
        self.dsn, self.schema, self.log_dir = dsn, schema, log_dir
        self.live: list[subprocess.Popen[bytes]] = []
        self.all: list[subprocess.Popen[bytes]] = []

    def spawn(self) -> None:
        """A worker; every other one runs the steps in groups (the others each on its own)."""
        node = f"tx-{uuid.uuid4().hex[:6]}"
        inline = "0.5" if len(self.all) % 2 == 0 else "0.005"
        log = open(self.log_dir / f"{node}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.tx_workload", "--dsn", self.dsn, "--schema", self.schema,
             "--node-id", node, "--inline-seconds", inline],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.live.append(process)
        self.all.append(process)

    def kill_one(self, rng: random.Random) -> None:
        process = self.live.pop(rng.randrange(len(self.live)))
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop_all(self) -> None:
        for process in self.all:
            if process.poll() is None:
                process.kill()
            process.wait(10)


def _crash_loop(pg_dsn: str, tmp_path: Path, runs: int, kills: int, grouped: bool) -> None:
    rng = random.Random(21)
    with fresh_schema(pg_dsn, prefix="dex_txcrash") as schema:
        adapter = PostgresAdapter(pg_dsn, schema=schema)  # migrates the schema; starts runs, never runs them
        workers = Workers(pg_dsn, schema, tmp_path)
        try:
            tx_workload.create_ledger(pg_dsn, schema)
            engine = dex.Engine(adapter, [tx_workload.ledger_run], [tx_workload.ledger_insert])
            pauses = (0.05, 0.1, 0.3)
            run_ids = [engine.start_workflow(tx_workload.ledger_run, rng.choice(pauses)) for _ in range(runs)]
            for _ in range(3):
                workers.spawn()
            busy_kills = 0  # kills while runs were still under way: the ones that prove something
            for _ in range(kills):
                time.sleep(rng.uniform(1.0, 2.0))
                busy_kills += any(not engine.get_run(r).status.is_terminal for r in run_ids)
                workers.kill_one(rng)
                workers.spawn()
            assert busy_kills >= min(kills, 3), "the runs ended before the kills: make the workload longer"
            deadline = time.monotonic() + 90
            pending = set(run_ids)
            while pending and time.monotonic() < deadline:
                pending = {r for r in pending if not engine.get_run(r).status.is_terminal}
                time.sleep(0.2)
            assert not pending, f"{len(pending)} runs did not end; logs in {tmp_path}"
            for run_id in run_ids:
                assert engine.wait(run_id, timeout=1) == list(range(tx_workload.STEPS))
            with psycopg.connect(pg_dsn) as conn:
                rows = conn.execute(
                    sql.SQL("SELECT run_id, step, tx FROM {}").format(sql.Identifier(schema, "tx_ledger"))
                ).fetchall()
            counts = Counter((str(run_id), int(step)) for run_id, step, _tx in rows)
            expected = {(run_id, step) for run_id in run_ids for step in range(tx_workload.STEPS)}
            assert set(counts) == expected
            assert [key for key, n in counts.items() if n != 1] == []  # exactly one row per step per run
            if grouped:  # steps of several runs committed in one transaction: groups ran, and were killed
                assert max(Counter(tx for _run, _step, tx in rows).values()) > 1
        finally:
            workers.stop_all()
            adapter.close()


def test_sigkilled_workers_leave_exactly_one_row_per_step(pg_dsn: str, tmp_path: Path) -> None:
    _crash_loop(pg_dsn, tmp_path, runs=48, kills=3, grouped=True)


@pytest.mark.slow
def test_sigkilled_workers_for_a_minute_leave_exactly_one_row_per_step(pg_dsn: str, tmp_path: Path) -> None:
    # 400 runs' first steps fill the activity queue, so first attempts mostly take the ordinary
    # path here (a group needs a queue with room): groups may or may not run
    _crash_loop(pg_dsn, tmp_path, runs=400, kills=30, grouped=False)
