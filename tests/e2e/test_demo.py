"""The demo as a user runs it: `dex demo`, interrupted with Ctrl-C, then run again to resume."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_env() -> Iterator[tuple[dict[str, str], str]]:
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_demo_test") as schema:
        env = {**os.environ, "DEX_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
        yield env, schema


def _demo(env: dict[str, str], schema: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dex", "demo", "--schema", schema],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_demo_resumes_after_ctrl_c(demo_env: tuple[dict[str, str], str]) -> None:
    env, schema = demo_env
    first = _demo(env, schema)
    assert first.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    for line in first.stdout:
        lines.append(line)
        if "TimerCreated" in line or time.monotonic() > deadline:
            break
    first.send_signal(signal.SIGINT)  # Ctrl-C during the cooling-off timer
    rest, _ = first.communicate(timeout=60)
    output = "".join(lines) + rest
    assert first.returncode == 130, output
    # each failed attempt of the card charge as it happened, with the time of its retry
    retried = re.findall(r"charge-card attempt (\d) failed: ConnectionError: .*; retrying at (\S+)", output)
    assert [attempt for attempt, _at in retried] == ["1", "2"], output
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", at) for _attempt, at in retried), output
    assert "interrupted" in output
    started = re.search(r"started run ([0-9a-f-]{36})", output)
    assert started is not None, output
    assert "RunCompleted" not in output

    second = _demo(env, schema)
    output2, _ = second.communicate(timeout=120)
    assert second.returncode == 0, output2
    assert f"resuming run {started.group(1)}" in output2
    assert "charge-A-1001-4200-after-3-attempts" in output2  # the retried activity, not redone
    assert output2.count("ActivityTaskCreated charge-card") == 1
    assert "result: {" in output2
