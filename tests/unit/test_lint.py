"""ruff (lint and format) is clean on the code, the tests, the benchmarks and the scripts.

ruff is pinned in the ``test`` extra, so the suite that CI runs checks it; its rules are in
``pyproject.toml`` (``[tool.ruff.lint]``). Fix a failure with ``ruff check --fix`` and
``ruff format`` over the same folders.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["dex", "tests", "benchmarks", "scripts"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *FOLDERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
