"""``scripts/test.sh``, run against stand-ins for python3 and apt-get: what it tells the person
waiting for it (a Chromium install that fails is said, with the lines that say why), and how
pytest reports its progress (file by file, with a count; not a page of bare dots)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "dirname", "mktemp", "tail", "rm", "id", "cat", "chmod", "mkdir", "cp")

# python3 -m venv .venv makes a .venv/bin/python that records how pytest was run
PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1 $2" = "-m pytest" ]; then
    shift 2
    echo "$@" > "$PYTEST_ARGS"
fi
exit 0
"""
APT_GET = """#!/usr/bin/env bash
[ "$1" = update ] && exit 0
echo "E: Unable to locate package chromium-driver" >&2
exit 100
"""


def stand_in(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text)
    (directory / name).chmod(0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs Chromium only as root")
def test_the_script_says_what_it_installs_and_runs_pytest_on_three_workers(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    bin_dir = tmp_path / "bin"  # the only PATH: no chromedriver on it, apt-get a stand-in
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    stand_in(bin_dir, "python3", PYTHON)
    stand_in(bin_dir, "apt-get", APT_GET)
    stand_in(bin_dir, "env", f'#!{shutil.which("bash")}\nexec "$@"\n')  # for the stand-ins' #! line
    recorded = tmp_path / "pytest-args"
    result = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "test.sh"), "-m", "slow"],
        env={"PATH": str(bin_dir), "PYTEST_ARGS": str(recorded), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("installing chromium and chromium-driver for the browser tests (a few minutes; log in ")
    assert "E: Unable to locate package chromium-driver" in lines  # why it failed, from the log
    assert any(line.startswith("could not install chromium (log in ") for line in lines)
    # no go on the PATH either: its install is tried, and its failure said, without failing the script
    assert any(line.startswith("installing golang-go for the Go SDK's tests (log in ") for line in lines)
    assert any(line.startswith("could not install golang-go (log in ") for line in lines)
    assert lines[-1] == "installing dex and its test extras into .venv ..."
    args = recorded.read_text().split()
    assert args == ["-q", "-n", "3", "--dist", "loadfile", "-m", "slow"]  # the counts: pyproject
