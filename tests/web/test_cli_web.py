"""``dex web``: it serves the dashboard and prints its URL; bad input is one line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.cli.conftest import invoke, one_line_error
from tests.pg import fresh_schema, postgres_dsn
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def schema() -> Iterator[tuple[str, str]]:
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_web") as name:
        yield dsn, name


def test_a_non_loopback_host_without_a_token_is_refused() -> None:
    result = invoke("web", "--host", "0.0.0.0", env={"DEX_WEB_TOKEN": None})
    assert result.exit_code == 2
    assert "without a token" in one_line_error(result)


@pytest.mark.parametrize(
    "args",
    [["--port", "70000"], ["--port", "x"], ["--host", "bad\x00host"], ["--token", " spaced "], ["--token", ""]],
    ids=["port-range", "port-text", "host-nul", "token-spaces", "token-empty"],
)
def test_bad_options_are_one_line_and_exit_2(args: list[str]) -> None:
    result = invoke("web", *args, env={"DEX_DATABASE_URL": "postgresql://nowhere/x"})
    assert result.exit_code == 2, result.output
    one_line_error(result)


def test_without_the_web_extra_it_says_what_to_install(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # an import of it raises ImportError
    result = invoke("web")
    assert result.exit_code == 2
    assert 'pip install "dex-engine[web]"' in one_line_error(result)


@pytest.mark.postgres
def test_it_serves_the_dashboard_and_the_api_and_prints_its_url(schema: tuple[str, str]) -> None:
    dsn, name = schema
    adapter = PostgresAdapter(dsn, schema=name, max_connections=2)
    try:
        engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        run_id = engine.start_workflow(checkout, 3, labels={"via": "cli"})
    finally:
        adapter.close()
    env = {**os.environ, "DEX_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), "DEX_WEB_TOKEN": "tok-123"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dex", "--schema", name, "web", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving the dex dashboard at http://127.0.0.1:"), line
        assert "tok-123" not in line
        url = line.split(" at ", 1)[1].split()[0]
        auth = {"authorization": "Bearer tok-123"}
        listed = httpx.get(url + "v1/runs", headers=auth, timeout=10).json()["runs"]
        assert [r["run_id"] for r in listed] == [run_id]
        assert httpx.get(url + "v1/runs", timeout=10).status_code == 401
        page = httpx.get(url + f"runs/{run_id}", headers=auth, timeout=10)
        assert page.status_code == 200 and "web-checkout" in page.text
        process.send_signal(signal.SIGINT)  # the reader's Ctrl-C: how a server is meant to stop
        assert process.wait(timeout=20) == 0
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    assert "tok-123" not in err
    assert "interrupted" not in err


@pytest.mark.postgres
def test_it_serves_the_remote_workers_api_over_http_and_grpc_behind_the_token(schema: tuple[str, str]) -> None:
    grpc = pytest.importorskip("grpc")
    from dex.v1 import service_pb2 as pb
    from dex.v1 import service_pb2_grpc as pb_grpc
    from tests.remote.support import one

    dsn, name = schema
    adapter = PostgresAdapter(dsn, schema=name, max_connections=2)
    try:
        engine = dex.Engine(adapter, workflows=[one])
        first = engine.start_workflow(one, "resize-image", 1)
        second = engine.start_workflow(one, "resize-image", 2)
        engine.drain()  # each run now waits for an activity no Python process registers
    finally:
        adapter.close()
    env = {**os.environ, "DEX_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), "DEX_WEB_TOKEN": "tok-9"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dex", "--schema", name, "web", "--port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split(" at ", 1)[1].split()[0]
        grpc_line = process.stdout.readline()
        assert grpc_line.startswith("serving the remote workers' gRPC API at 127.0.0.1:"), grpc_line
        port = int(grpc_line.rsplit(":", 1)[1])
        auth = {"authorization": "Bearer tok-9"}
        poll = {"worker_id": "w", "names": ["resize-image"], "max": 1, "wait_seconds": 5}
        assert httpx.post(url + "v1/activity-tasks/poll", json=poll, timeout=10).status_code == 401
        (task,) = httpx.post(url + "v1/activity-tasks/poll", json=poll, headers=auth, timeout=10).json()
        assert task["run_id"] in (first, second) and task["args"] == [1 if task["run_id"] == first else 2]
        done = {"lease_version": task["lease_version"], "result": "resized"}
        assert httpx.post(url + f"v1/activity-tasks/{task['task_id']}/complete", json=done, headers=auth).json() == {}
        paths = httpx.get(url + "v1/openapi.json", headers=auth, timeout=10).json()["paths"]
        assert "/v1/activity-tasks/poll" in paths and "/v1/activity-tasks/{task_id}/heartbeat" in paths
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ActivityTaskServiceStub(channel)
            request = pb.PollRequest(worker_id="g", names=["resize-image"], max=1, wait_seconds=5)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Poll(request, timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
            (other,) = stub.Poll(request, timeout=10, metadata=[("authorization", "Bearer tok-9")]).tasks
            assert other.run_id != task["run_id"]
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    assert "tok-9" not in err


def test_grpc_port_without_the_grpc_extra_says_what_to_install(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "dex.remote.grpc_server", None)  # as if grpcio were missing
    result = invoke("web", "--grpc-port", "0")
    assert result.exit_code == 2
    assert 'pip install "dex-engine[grpc]"' in one_line_error(result)
