"""Worker processes sharing one database: crashes, graceful stops and a database restart.

Each worker is a separate Python process (:mod:`tests.integration.worker_main`) running an
engine over the test's schema; the test process starts runs and inspects the results, the
histories, and the side table in which every activity execution is recorded
(:mod:`tests.integration.workload`). What must hold (docs/reference/contract.md §6):

* every run completes with the right result, its outcome recorded exactly once;
* activities run at least once, and two workers never hold the same attempt of a task;
* a killed worker's tasks move to another worker when their leases expire;
* a worker stopped gracefully leaves nothing behind: no task it holds, no step to redo;
* a database restart makes the workers wait and carry on, not die or lose runs.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.integration import workload
from tests.pg import dedicated_server, fresh_schema

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


class Worker:
    """One worker process; its output goes to a log file (a pipe nobody reads could fill up)."""

    def __init__(self, dsn: str, schema: str, node_id: str, log_dir: Path, *extra: str) -> None:
        self.node_id = node_id
        self.log_path = log_dir / f"{node_id}.log"
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.worker_main", "--dsn", dsn, "--schema", schema,
             "--node-id", node_id, *extra],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while f"ready {self.node_id}" not in self.output():
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.node_id} exited early:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.node_id} not ready after {timeout} s:\n{self.output()}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.returncode is not None:
                self._log.close()

    def alive(self) -> bool:
        return self.process.poll() is None


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Starts worker processes; whatever is still running at the end is killed."""
    workers: list[Worker] = []

    def start(dsn: str, schema: str, *extra: str, node_id: str | None = None) -> Worker:
        worker = Worker(dsn, schema, node_id or f"w{len(workers)}-{uuid.uuid4().hex[:6]}", tmp_path, *extra)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.alive():
            worker.process.kill()
        worker.wait(10)


class Cluster:
    """The test process's view of a schema shared with worker processes."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.adapter = PostgresAdapter(dsn, schema=schema)
        # never started: the test process only starts runs and reads them
        self.engine = dex.Engine(self.adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
        workload.create_side_table(dsn, schema)
        self.runs: dict[str, int] = {}  # run id -> the n it was started with
        self.pauses: dict[str, float] = {}  # run id -> the seconds each of its steps sleeps

    def start(self, count: int, pause: float, activity: str) -> list[str]:
        run_ids = []
        for _ in range(count):
            n = len(self.runs)
            run_id = self.engine.start_workflow(workload.pipeline, n, pause, activity)
            self.runs[run_id] = n
            self.pauses[run_id] = pause
            run_ids.append(run_id)
        return run_ids

    def query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A statement on a connection of its own, ``{s}`` standing for the schema."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql.SQL(text).format(s=sql.Identifier(self.schema)), list(params)).fetchall()

    def executions(self) -> list[tuple[str, int, int, int]]:
        """(run_id, step, attempt, pid) of every activity execution so far, in order."""
        rows = self.query("SELECT run_id, step, attempt, pid FROM {s}.executions ORDER BY at")
        return [(str(run_id), int(step), int(attempt), int(pid)) for run_id, step, attempt, pid in rows]

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``condition`` until it holds; database errors (a restart) count as "not yet"."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.1)

    def finished(self) -> int:
        rows = self.query(
            "SELECT count(*) FROM {s}.runs WHERE run_id = ANY(%s) AND status = ANY(%s)",
            [list(self.runs), list(TERMINAL)],
        )
        return int(rows[0][0])

    def wait_all(self, timeout: float) -> None:
        self.wait_until(lambda: self.finished() == len(self.runs), timeout, f"{len(self.runs)} runs to finish")

    def check_outcomes(self) -> Counter[tuple[str, int]]:
        """Assert every run completed once with the right result; return executions per step."""
        for run_id, n in self.runs.items():
            info = self.engine.get_run(run_id)
            assert info.status is dex.RunStatus.COMPLETED, (run_id, info.status, info.failure)
            assert info.result == workload.expected(n)
            history = self.engine.history(run_id)
            kinds = Counter(event.kind for event in history)
            assert kinds["RunCompleted"] == 1, kinds
            dex.testing.replay(workload.pipeline, history, activities=workload.ACTIVITIES)  # it replays
            assert kinds["ActivityTaskCreated"] == kinds["ActivityTaskCompleted"] == len(workload.STEPS), kinds
        executions = self.executions()
        self.check_no_attempt_ran_twice_at_once()
        per_step = Counter((run_id, step) for run_id, step, _attempt, _pid in executions)
        assert set(per_step) == {(run_id, step) for run_id in self.runs for step in workload.STEPS}
        return per_step

    def check_no_attempt_ran_twice_at_once(self) -> None:
        """A claim bumps the attempt, so an attempt of a task runs once: two executions would be
        two lease holders at once. A first attempt may also run in the thread of a workflow task
        or of the attempt before it (inline, chained: at least once, as the contract says), holding no lease
        of its own; when its process dies or the write that carries it fails, it runs again,
        as attempt 1 of its task. So attempts after the first run once, and two executions of a
        first attempt never overlap: the later one begins after the earlier one's work (its
        ``pause``) is over."""
        rows = self.query("SELECT run_id, step, attempt, at FROM {s}.executions ORDER BY at")
        times: dict[tuple[str, int, int], list[datetime]] = defaultdict(list)
        for run_id, step, attempt, at in rows:
            times[(str(run_id), int(step), int(attempt))].append(at)
        again = {key: at for key, at in times.items() if len(at) > 1}
        assert all(attempt == 1 for _run, _step, attempt in again), sorted(again)
        for (run_id, step, attempt), started in again.items():
            pause = timedelta(seconds=self.pauses[run_id])
            for earlier, later in itertools.pairwise(started):
                assert later >= earlier + pause, (run_id, step, attempt, earlier, later)

    def locked_by(self, node_id: str) -> int:
        rows = self.query(
            "SELECT (SELECT count(*) FROM {s}.workflow_tasks WHERE locked_by = %s)"
            " + (SELECT count(*) FROM {s}.activity_tasks WHERE locked_by = %s)",
            [node_id, node_id],
        )
        return int(rows[0][0])

    def close(self) -> None:
        self.adapter.close()


@pytest.fixture
def cluster(pg_dsn: str, pg_schema: str) -> Iterator[Cluster]:
    shared = Cluster(pg_dsn, pg_schema)
    yield shared
    shared.close()


def _running_on(cluster: Cluster, worker: Worker, at_least: int) -> Callable[[], bool]:
    return lambda: sum(1 for *_, pid in cluster.executions() if pid == worker.pid) >= at_least


def test_two_worker_processes_share_the_work(cluster: Cluster, spawn: Callable[..., Worker]) -> None:
    workers = [spawn(cluster.dsn, cluster.schema) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    cluster.start(40, pause=0.05, activity="step")
    cluster.wait_all(timeout=30)

    per_step = cluster.check_outcomes()
    assert set(per_step.values()) == {1}  # healthy workers, long leases: every step ran exactly once
    pids = {pid for *_, pid in cluster.executions()}
    assert pids == {worker.pid for worker in workers}  # both took part
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait(30) for worker in workers] == [0, 0]


def test_a_killed_workers_runs_finish_on_another_after_its_leases_expire(
    cluster: Cluster, spawn: Callable[..., Worker]
) -> None:
    victim, survivor = spawn(cluster.dsn, cluster.schema), spawn(cluster.dsn, cluster.schema)
    victim.wait_ready()
    survivor.wait_ready()
    cluster.start(24, pause=1.0, activity="short-step")  # 2 s leases, 1 s per step
    cluster.wait_until(_running_on(cluster, victim, 3), 20, "the victim to run some steps")
    victim.signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    killed_at = time.monotonic()
    cluster.wait_all(timeout=60)
    print(f"all runs finished {time.monotonic() - killed_at:.1f} s after the kill")

    per_step = cluster.check_outcomes()  # nothing lost, every outcome recorded once
    executions = cluster.executions()
    victims_steps = {(run_id, step) for run_id, step, _a, pid in executions if pid == victim.pid}
    retaken = {
        (run_id, step)
        for run_id, step, attempt, pid in executions
        if pid == survivor.pid and attempt > 1 and (run_id, step) in victims_steps
    }
    assert retaken, "some step the victim was running should have been taken over with a new attempt"
    assert all(per_step[key] >= 2 for key in retaken)
    assert survivor.alive()


def test_a_graceful_stop_under_load_loses_nothing(cluster: Cluster, spawn: Callable[..., Worker]) -> None:
    stopping, staying = spawn(cluster.dsn, cluster.schema), spawn(cluster.dsn, cluster.schema)
    stopping.wait_ready()
    staying.wait_ready()
    cluster.start(40, pause=0.3, activity="step")  # 60 s leases: a lost task would stall the test
    cluster.wait_until(_running_on(cluster, stopping, 4), 20, "the stopping worker to run some steps")
    stopping.signal(signal.SIGTERM)
    assert stopping.wait(30) == 0, stopping.output()
    assert f"stopped {stopping.node_id}" in stopping.output()
    assert cluster.locked_by(stopping.node_id) == 0  # every task it held is done or released
    assert cluster.query("SELECT node_id FROM {s}.leader WHERE node_id = %s", [stopping.node_id]) == []
    assert cluster.finished() < len(cluster.runs)  # the stop came under load
    cluster.wait_all(timeout=30)

    per_step = cluster.check_outcomes()
    # what the stopped worker started it finished and acknowledged: nobody ran a step twice
    assert set(per_step.values()) == {1}
    assert any(pid == stopping.pid for *_, pid in cluster.executions())


def test_workers_ride_out_a_database_restart(spawn: Callable[..., Worker]) -> None:
    pytest.importorskip("pgserver")
    with dedicated_server() as server, fresh_schema(server.dsn) as schema:
        cluster = Cluster(server.dsn, schema)
        try:
            workers = [spawn(server.dsn, schema) for _ in range(2)]
            for worker in workers:
                worker.wait_ready()
            cluster.start(30, pause=0.3, activity="short-step")
            cluster.wait_until(lambda: len(cluster.executions()) >= 15, 20, "some steps to run")
            assert cluster.finished() < len(cluster.runs)
            before = server.postmaster_pid()
            server.restart("immediate")  # a crash: open transactions and connections are gone
            assert server.postmaster_pid() != before
            restarted_at = time.monotonic()
            cluster.wait_all(timeout=60)
            print(f"all runs finished {time.monotonic() - restarted_at:.1f} s after the restart")

            cluster.check_outcomes()
            assert all(worker.alive() for worker in workers)  # they waited it out
            for worker in workers:
                worker.signal(signal.SIGTERM)
            assert [worker.wait(30) for worker in workers] == [0, 0]
        finally:
            cluster.close()


@pytest.mark.slow
def test_random_kills_lose_and_duplicate_nothing(cluster: Cluster, spawn: Callable[..., Worker]) -> None:
    rng = random.Random(20240601)
    # the workers' connections carry a name, so that only theirs are terminated below
    worker_dsn = make_conninfo(cluster.dsn, application_name="dex-chaos-worker")
    workers = [spawn(worker_dsn, cluster.schema) for _ in range(4)]
    for worker in workers:
        worker.wait_ready()
    kills = terminated = 0
    deadline = time.monotonic() + 90
    next_kill = time.monotonic() + rng.uniform(1, 3)
    next_terminate = time.monotonic() + rng.uniform(2, 5)
    while time.monotonic() < deadline:
        if time.monotonic() >= next_terminate:
            # kill one of the workers' database connections under them, as an operator or a
            # proxy might: the pool must replace it and the interrupted work must be redone
            rows = cluster.query(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ("
                " SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                " AND application_name = 'dex-chaos-worker'"
                " ORDER BY random() LIMIT 1) AS victim"
            )
            terminated += int(rows[0][0])
            next_terminate = time.monotonic() + rng.uniform(2, 5)
        cluster.start(4, pause=rng.choice((0.05, 0.2, 0.5)), activity="short-step")
        if time.monotonic() >= next_kill:
            victim = rng.choice([worker for worker in workers if worker.alive()])
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            kills += 1
            workers.remove(victim)
            workers.append(spawn(worker_dsn, cluster.schema))  # a replacement, as a supervisor would
            next_kill = time.monotonic() + rng.uniform(1, 3)
        time.sleep(0.25)
    cluster.wait_all(timeout=120)

    statuses = Counter(info.status.value for info in (cluster.engine.get_run(r) for r in cluster.runs))
    completions = Counter(
        sum(1 for event in cluster.engine.history(run_id) if event.kind == "RunCompleted") for run_id in cluster.runs
    )
    per_step = Counter((run_id, step) for run_id, step, _a, _p in cluster.executions())
    lost = len(cluster.runs) - statuses["COMPLETED"]
    duplicated = sum(count for times, count in completions.items() if times > 1)
    unexpected = sum(
        1
        for run_id, n in cluster.runs.items()
        if (info := cluster.engine.get_run(run_id)).status is dex.RunStatus.COMPLETED
        and info.result != workload.expected(n)
    )
    print(
        f"\n{len(cluster.runs)} runs, {kills} workers killed, {terminated} connections terminated:"
        f" {lost} lost, {duplicated} duplicated (more than one"
        f" RunCompleted), {unexpected} unexpected results; {sum(per_step.values()) - len(per_step)} activity"
        f" re-executions (at least once, as promised)"
        f" over {len(per_step)} steps"
    )
    assert lost == 0 and duplicated == 0 and unexpected == 0
    cluster.check_outcomes()


def test_a_killed_workers_long_activity_moves_within_the_short_lease(
    cluster: Cluster, spawn: Callable[..., Worker]
) -> None:
    """docs/reference/contract.md §8: the five-minute ``lock_timeout`` does not hold the task; the short activity
    lease (2 s here, 30 s by default), which a live worker keeps extending, does."""
    short = ("--activity-lease", "2")
    victim = spawn(cluster.dsn, cluster.schema, *short)
    victim.wait_ready()
    run_id = cluster.engine.start_workflow(workload.long_job, 4, 600.0)  # ten minutes, if left alone
    cluster.wait_until(_running_on(cluster, victim, 1), 20, "the victim to start the long activity")
    survivor = spawn(cluster.dsn, cluster.schema, *short)
    survivor.wait_ready()
    time.sleep(5)  # over two short leases: the live victim keeps extending its lease
    assert [(attempt, pid) for _r, _s, attempt, pid in cluster.executions()] == [(1, victim.pid)]
    [(locked_by,)] = cluster.query("SELECT locked_by FROM {s}.activity_tasks")
    assert locked_by == victim.node_id

    victim.signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    killed_at = time.monotonic()
    assert cluster.engine.wait(run_id, timeout=20) == 41
    took = time.monotonic() - killed_at
    print(f"the run completed {took:.1f} s after the kill")
    assert took < 15  # the short lease, not the five minutes of lock_timeout
    assert [(attempt, pid) for _r, _s, attempt, pid in cluster.executions()] == [(1, victim.pid), (2, survivor.pid)]
    assert survivor.alive()
