"""`dex dev`: an embedded PostgreSQL held until Ctrl-C, its DSN printed, the dashboard served.

Each ``dex dev`` runs as a real process (it holds the server for its lifetime and takes
SIGINT as a user's Ctrl-C), on a data directory of the test's own and a port the system
chose; the test reads the lines it prints, as a user would copy them.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import attrs
import psycopg
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter

pytest.importorskip("pgserver", reason="dex dev needs the embedded extra (pgserver)")

STARTUP = 90.0  # seconds: initdb and the first start of a server on a busy machine


@dex.activity(name="dev-greet")
def greet(name: str) -> str:
    return f"hello {name}"


@dex.workflow(name="dev-hello")
async def hello(ctx: dex.WorkflowContext, name: str) -> str:
    return await ctx.activity(greet, name)


@attrs.define
class DevProcess:
    """A running ``dex dev`` and what it printed so far."""

    process: subprocess.Popen[str]
    stdout: queue.Queue[str]
    stderr: list[str]
    readers: list[threading.Thread]

    def line(self, prefix: str, timeout: float = STARTUP) -> str:
        """The next line on stdout that starts with ``prefix``."""
        while True:
            try:
                line = self.stdout.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r}; stderr: {''.join(self.stderr)}") from None
            if line.startswith(prefix):
                return line.rstrip("\n")

    def dsn(self) -> str:
        # the line is shell: run it, or read it as a shell would
        words = shlex.split(self.line("export DEX_DATABASE_URL="))
        assert words[0] == "export"
        return words[1].partition("=")[2]

    def url(self) -> str:
        return self.line("serving the dex dashboard at ").rpartition(" ")[2]

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self) -> int:
        """Its exit code, once it exited and everything it printed has been read; if it does not
        exit, the failure shows where each of its threads is (faulthandler, on SIGABRT)."""
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(timeout=10)
            for reader in self.readers:
                reader.join(timeout=10)
            raise AssertionError("dex dev did not exit:\n" + "".join(self.stderr)) from None
        for reader in self.readers:
            reader.join(timeout=10)
        return code


def _pump(stream: IO[str], into: queue.Queue[str] | list[str]) -> None:
    for line in stream:
        into.put(line) if isinstance(into, queue.Queue) else into.append(line)


def start_dev(*args: str) -> DevProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    env.pop("DEX_DATABASE_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "dex", "dev", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    stdout: queue.Queue[str] = queue.Queue()
    stderr: list[str] = []
    readers = [
        threading.Thread(target=_pump, args=(process.stdout, stdout), daemon=True),
        threading.Thread(target=_pump, args=(process.stderr, stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    return DevProcess(process, stdout, stderr, readers)


@pytest.fixture
def devs() -> Iterator[list[DevProcess]]:
    """The ``dex dev`` processes a test started; any still running at its end are stopped."""
    started: list[DevProcess] = []
    yield started
    for dev in started:
        if dev.process.poll() is None:
            dev.process.send_signal(signal.SIGINT)
            try:
                dev.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                dev.process.kill()


def reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def test_dev_serves_a_database_and_the_dashboard_until_ctrl_c(tmp_path: Path, devs: list[DevProcess]) -> None:
    data_dir = tmp_path / "data"
    first = start_dev("--data-dir", str(data_dir), "--port", "0")
    devs.append(first)
    dsn = first.dsn()
    url = first.url()
    assert url.startswith("http://127.0.0.1:")
    assert reachable(dsn)

    # an application's engine on the printed DSN: the schema is there, its runs show on the dashboard
    adapter = PostgresAdapter(dsn, migrate=False, max_connections=2)
    try:
        engine = dex.Engine(adapter, workflows=[hello], activities=[greet])
        run_id = engine.start_workflow(hello, "newcomer")
        engine.drain()
        assert engine.get_run(run_id).status == dex.RunStatus.COMPLETED
    finally:
        adapter.close()
    with urllib.request.urlopen(url + "runs", timeout=30) as response:
        assert response.status == 200
        assert run_id in response.read().decode("utf-8")
    with urllib.request.urlopen(f"{url}v1/runs/{run_id}", timeout=30) as response:
        assert json.loads(response.read())["result"] == "hello newcomer"
    # the remote workers' routes too, as dex web serves them
    poll = urllib.request.Request(
        url + "v1/activity-tasks/poll",
        data=json.dumps({"worker_id": "dev-test", "names": ["nothing-queued"]}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(poll, timeout=30) as response:
        assert json.loads(response.read()) == []

    # a second dex dev on the same directory reuses the running server, as does embedded_dsn()
    second = start_dev("--data-dir", str(data_dir), "--port", "0")
    devs.append(second)
    assert second.dsn() == dsn
    second.url()  # serving: it is past the point of saying whether it reused the server
    assert any("reusing the embedded PostgreSQL server" in line for line in second.stderr), second.stderr
    script = f"from dex.adapters.postgres import embedded_dsn; print(embedded_dsn({str(data_dir)!r}))"
    from_script = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert from_script.returncode == 0, from_script.stderr
    assert from_script.stdout.strip() == dsn

    # Ctrl-C: exit 0; the server stays up while another dex dev holds it, and stops with the last
    assert first.interrupt() == 0, "".join(first.stderr)
    assert reachable(dsn)
    assert second.interrupt() == 0, "".join(second.stderr)
    assert not reachable(dsn)


def test_dev_on_a_port_in_use_is_one_line_and_starts_nothing(tmp_path: Path, devs: list[DevProcess]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        dev = start_dev("--data-dir", str(tmp_path / "data"), "--port", str(port))
        devs.append(dev)
        assert dev.wait() == 1
    lines = [line.rstrip("\n") for line in dev.stderr]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}"), lines
    assert not (tmp_path / "data").exists()


def test_a_dex_dev_that_was_killed_does_not_keep_the_server_up_for_ever(tmp_path: Path, devs: list[DevProcess]) -> None:
    data_dir = tmp_path / "data"
    killed = start_dev("--data-dir", str(data_dir), "--port", "0")
    devs.append(killed)
    dsn = killed.dsn()
    killed.url()
    killed.process.kill()  # SIGKILL: it cannot say it let go of the server
    assert killed.wait() == -signal.SIGKILL
    assert reachable(dsn)  # the server it started runs on, held by no live process

    successor = start_dev("--data-dir", str(data_dir), "--port", "0")
    devs.append(successor)
    assert successor.dsn() == dsn
    successor.url()
    assert successor.interrupt() == 0, "".join(successor.stderr)
    assert not reachable(dsn)  # the last live holder stopped it


def test_ctrl_c_while_the_dashboard_starts_stops_it_too(tmp_path: Path, devs: list[DevProcess]) -> None:
    """A SIGINT between the DSN line and the dashboard's start (before uvicorn takes the signal
    itself) used to be swallowed: dex dev then served until a second Ctrl-C."""
    dev = start_dev("--data-dir", str(tmp_path / "data"), "--port", "0")
    devs.append(dev)
    dsn = dev.dsn()
    assert dev.interrupt() == 0, "".join(dev.stderr)
    assert not reachable(dsn)
