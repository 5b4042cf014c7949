"""The examples of published values and streams run as a user runs them: in memory, and on
PostgreSQL with DEX_DATABASE_URL (docs/reference/contract.md §14)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import fresh_schema, postgres_dsn

ROOT = Path(__file__).resolve().parents[2]
WHERE = ["memory", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=WHERE)
def env_and_args(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], list[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DEX_DATABASE_URL", None)
    if request.param == "memory":
        yield env, []
        return
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_examples_test") as schema:
        yield {**env, "DEX_DATABASE_URL": dsn}, ["--schema", schema]


def run_example(name: str, env: dict[str, str], args: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_progress_stream(env_and_args: tuple[dict[str, str], list[str]]) -> None:
    lines = run_example("progress_stream.py", *env_and_args)
    assert lines == [
        "progress: 1/4 (orders)",
        "progress: 2/4 (refunds)",
        "progress: 3/4 (stock)",
        "progress: 4/4 (shipping)",
        "stage: written",
        "result: {'orders': 3, 'refunds': 3, 'stock': 3, 'shipping': 3}",
        "lines streamed by the activities: 12",
    ]


def test_widget_checkout(env_and_args: tuple[dict[str, str], list[str]]) -> None:
    lines = run_example("widget_checkout.py", *env_and_args)
    statuses = [line.removeprefix("status: ") for line in lines if line.startswith("status: ")]
    # a watcher sees the latest value each time it looks: quick stages may be skipped, never reordered
    order = ["reserving", "charging", "packing", "shipped", "delivered"]
    assert statuses[-2:] == ["shipped", "delivered"] and statuses == sorted(statuses, key=order.index)
    assert [line for line in lines if line.startswith("log: ")] == [
        "log: reserved: reservation-3",
        "log: charged 2100 cents: charge-2100",
        "log: packed flange 1 of 1",
        "log: packed sprocket 1 of 2",
        "log: packed sprocket 2 of 2",
        "log: shipped 3 widgets",
        "log: delivered, signed by Ada",
    ]
    assert lines[-1] == "result: {'order': 'W-1001', 'receipt': 'charge-2100'}"
