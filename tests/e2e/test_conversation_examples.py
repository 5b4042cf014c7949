"""``examples/hello_update.py`` and ``examples/hello_query.py`` run as a user runs them: in memory
with a virtual clock, and on PostgreSQL with a started engine (docs/how-to/talk-to-a-running-workflow.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import fresh_schema, postgres_dsn

ROOT = Path(__file__).resolve().parents[2]

UPDATE_OUTPUT = [
    "add lamp -> {'items': 1, 'total': 400}",
    "add desk -> {'items': 2, 'total': 800}",
    "add lamp again -> {'items': 1, 'total': 400}",
    "refused: an item needs a name",
    "checkout -> 800",
    "result: {'customer': 'ann', 'items': ['lamp', 'desk'], 'total': 800}",
]
QUERY_OUTPUT = [
    "last before any tick: none yet",
    "count: 2",
    "last: second",
    "refused: workflow 'hello-counter' has no query named 'average' (known: 'count', 'last')",
    "result: 3",
    "count after the end: 3",
]


def run_example(name: str, env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DEX_DATABASE_URL", "DEX_SCHEMA")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(("name", "expected"), [("hello_update.py", UPDATE_OUTPUT), ("hello_query.py", QUERY_OUTPUT)])
def test_the_examples_run_in_memory(name: str, expected: list[str]) -> None:
    assert run_example(name, {}) == expected


@pytest.mark.postgres
@pytest.mark.parametrize(("name", "expected"), [("hello_update.py", UPDATE_OUTPUT), ("hello_query.py", QUERY_OUTPUT)])
def test_the_examples_run_on_postgresql_with_a_started_engine(name: str, expected: list[str]) -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_examples") as schema:
        assert run_example(name, {"DEX_DATABASE_URL": dsn, "DEX_SCHEMA": schema}) == expected
