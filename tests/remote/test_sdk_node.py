"""The Node worker SDK (``clients/node``, docs/reference/contract.md §16): its own test suite, ``node --test``,
run against a real ``dex web`` served here (skipped only when ``node`` is missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import dex
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService
from tests.remote.support import free_port
from tests.remote.worker_support import TOKEN, dex_web, sdk_engine

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE = shutil.which("node")


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[dex.Engine]:
    with sdk_engine(request.param) as engine:
        yield engine


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_node_sdk_suite_passes_against_dex_web(engine: dex.Engine) -> None:
    assert NODE is not None
    service = ActivityTaskService(engine, poll_interval=0.2, lease=timedelta(seconds=1.5))
    with dex_web(engine, service, free_port()) as url:
        env = {**os.environ, "DEX_URL": url, "DEX_TOKEN": TOKEN}
        done = subprocess.run(
            [NODE, "--test", "test/"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=300
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "# fail 0" in report and "# skipped 0" in report, report
    statuses = [run.status for run in engine.list_runs(limit=1000)]
    # the suite's runs, ended in the store: 14 completed, 10 failed (poison and refusals), 1 cancelled
    assert statuses.count(RunStatus.COMPLETED) >= 14, statuses
    assert statuses.count(RunStatus.FAILED) >= 10 and RunStatus.CANCELLED in statuses, statuses
    assert RunStatus.RUNNING not in statuses, statuses
