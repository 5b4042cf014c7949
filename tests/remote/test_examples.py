"""The example workers of ``examples/`` against a real HTTP server: the Node worker (skipped
only when ``node`` is missing) and the Python worker that uses nothing but urllib."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService, PolledTask
from tests.remote.support import http_server, one, resize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


class WatchedService(ActivityTaskService):
    """The service, remembering what its polls handed out (the tests wait for a claim)."""

    handed: list[PolledTask]

    def poll(self, *args: Any, **kwargs: Any) -> list[PolledTask]:
        tasks = super().poll(*args, **kwargs)
        self.handed = [*getattr(self, "handed", []), *tasks]
        return tasks

    async def poll_async(self, *args: Any, **kwargs: Any) -> list[PolledTask]:  # the HTTP routes' poll
        tasks = await super().poll_async(*args, **kwargs)
        self.handed = [*getattr(self, "handed", []), *tasks]
        return tasks


def _worker(command: list[str], url: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*command, "--url", url, *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _node(url: str, *options: str) -> subprocess.Popen[str]:
    assert NODE is not None
    return _worker([NODE, str(EXAMPLES / "remote_worker.js")], url, *options)


def _python(url: str, *options: str) -> subprocess.Popen[str]:
    return _worker([sys.executable, str(EXAMPLES / "remote_worker.py")], url, *options)


def _claimed(service: WatchedService, count: int = 1) -> list[PolledTask]:
    deadline = time.monotonic() + 20
    while len(getattr(service, "handed", [])) < count:
        assert time.monotonic() < deadline, "no worker claimed the task"
        time.sleep(0.02)
    return service.handed


@pytest.fixture
def served(engine: dex.Engine) -> Iterator[tuple[WatchedService, str]]:
    service = WatchedService(engine, poll_interval=0.5, lease=timedelta(seconds=1.5))
    with http_server(service) as url:
        yield service, url


IMAGES = [{"name": f"img{i}.png", "width": 100 * i, "height": 50 * i} for i in range(1, 4)]
HALVED = [{"name": f"img{i}.png", "width": 50 * i, "height": 25 * i} for i in range(1, 4)]


@needs_node
def test_the_node_worker_completes_the_activities_of_a_running_workflow(
    engine: dex.Engine, served: tuple[WatchedService, str]
) -> None:
    _service, url = served
    worker = _node(url, "--names", "resize-image", "--max-tasks", "3")
    try:
        run_id = engine.start_workflow(resize, IMAGES)
        assert engine.wait(run_id, timeout=30) == HALVED
        output, _ = worker.communicate(timeout=20)
    finally:
        worker.kill()
    assert worker.returncode == 0, output
    assert output.count(": completed") == 3, output


def test_the_python_worker_completes_the_activities_of_a_running_workflow(
    engine: dex.Engine, served: tuple[WatchedService, str]
) -> None:
    _service, url = served
    worker = _python(url, "--names", "resize-image,refuse", "--max-tasks", "4")
    try:
        run_id = engine.start_workflow(resize, IMAGES)
        assert engine.wait(run_id, timeout=30) == HALVED
        refused = engine.start_workflow(one, "refuse", "no such image", 1)
        with pytest.raises(dex.WorkflowFailedError, match="no such image"):
            engine.wait(refused, timeout=30)
        output, _ = worker.communicate(timeout=20)
    finally:
        worker.kill()
    assert worker.returncode == 0, output
    assert output.count(": completed") == 3 and output.count(": failed") == 1, output


@needs_node
def test_a_worker_killed_mid_task_has_its_task_retried_after_the_lease(
    engine: dex.Engine, served: tuple[WatchedService, str]
) -> None:
    service, url = served
    worker = _node(url, "--names", "hang")
    try:
        run_id = engine.start_workflow(one, "hang", 1)
        (first,) = _claimed(service)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
    assert first.attempt == 1
    (second,) = service.poll("rescuer", ["hang"], 1, 20)  # once the 1.5 s lease has lapsed
    assert (second.task_id, second.attempt) == (first.task_id, 2)
    assert second.lease_version != first.lease_version  # a claim of its own, under a token of its own
    service.complete(second.task_id, second.lease_version, "rescued")
    assert engine.wait(run_id, timeout=10) == "rescued"


@needs_node
def test_cancellation_reaches_a_heartbeating_node_worker(
    engine: dex.Engine, served: tuple[WatchedService, str]
) -> None:
    service, url = served
    worker = _node(url, "--names", "slow", "--max-tasks", "1")
    try:
        run_id = engine.start_workflow(one, "slow", 60)
        _claimed(service)
        time.sleep(0.5)
        engine.cancel(run_id)
        output, _ = worker.communicate(timeout=15)  # it stops well before its 60 s of work
    finally:
        worker.kill()
    assert worker.returncode == 0, output
    assert ": cancelled" in output, output
    assert engine.get_run(run_id).status is RunStatus.CANCELLED
    healthy = engine.start_workflow(one, "echo", 1)
    (task,) = service.poll("w", ["echo"], 1, 10)
    service.complete(task.task_id, task.lease_version, 2)
    assert engine.wait(healthy, timeout=10) == 2
