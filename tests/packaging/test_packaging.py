"""The package as it is published: ``python -m build`` makes a wheel and an sdist that
``twine check`` accepts, with PEP 639 license metadata and no setuptools deprecation warning;
and a new venv holding only the wheel (and its dependencies, from the package index) runs the
README's "A workflow in 30 lines". About 30 s together: one build serves both.

The build runs on a copy of the source tree, so that setuptools' ``build/`` and ``*.egg-info``
land in a temporary directory, not in the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# what a checkout holds that is no part of a source distribution
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".dex-data",
    ".hypothesis",
)

pytest.importorskip("build", reason="the test extra's build package is not installed")
pytest.importorskip("twine", reason="the test extra's twine package is not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The wheel, the sdist and the build's output, built once from a copy of the tree."""
    tmp_path = tmp_path_factory.mktemp("build")
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return wheel, sdist, done.stdout + done.stderr


def wheel_metadata(wheel: Path) -> tuple[dict[str, list[str]], set[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (path,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        message = HeaderParser().parsestr(archive.read(path).decode("utf-8"))
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(value)
    return headers, names


def test_build_makes_a_wheel_and_sdist_that_twine_accepts_with_pep_639_license_metadata(
    built: tuple[Path, Path, str],
) -> None:
    wheel, sdist, output = built
    assert not re.search(r"deprecat", output, re.IGNORECASE), [
        line for line in output.splitlines() if "eprecat" in line
    ]
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    headers, names = wheel_metadata(wheel)
    assert headers["Name"] == ["dex-engine"]
    assert headers["License-Expression"] == ["Apache-2.0"]
    assert headers["License-File"] == ["LICENSE"]
    assert not any(
        value.startswith("License ::") for value in headers.get("Classifier", [])
    )  # PEP 639: one or the other
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    # the files the package reads at run time, and the console script
    assert {"dex/py.typed", "dex/web/templates/base.html"} <= names
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        assert "dex = dex.__main__:main" in archive.read(entry_points).decode("utf-8")
    with tarfile.open(sdist) as archive:
        members = {Path(name).relative_to(Path(name).parts[0]).as_posix() for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "dex/__init__.py"} <= members


def without_python_path() -> dict[str, str]:
    """This environment (pip's settings with it) but no PYTHONPATH: the checkout on it holds a
    dex_engine.egg-info, which pip would take for the package installed already."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}


def readme_example() -> str:
    """The code of the README's "A workflow in 30 lines", and what it prints."""
    section = README.read_text(encoding="utf-8").split("## A workflow in 30 lines", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's example is no longer a python block"
    return match.group(1)


def test_a_venv_with_only_the_wheel_runs_the_readme_example(built: tuple[Path, Path, str], tmp_path: Path) -> None:
    wheel, _sdist, _output = built
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
        env=without_python_path(),
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    code = readme_example()
    expected = re.search(r"print\(engine\.wait\(run_id\)\)\s+#\s*(\{.*\})", code)
    assert expected is not None, "the example no longer says what it prints"
    example = tmp_path / "example.py"
    example.write_text(code, encoding="utf-8")
    # a clean environment and another directory: the dex that runs is the wheel's, not the checkout's
    ran = subprocess.run(
        [str(python), str(example)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == expected.group(1)
    where = subprocess.run(
        [str(python), "-c", "import dex; print(dex.__file__)"], capture_output=True, text=True, cwd=tmp_path, env={}
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout
    dex_cli = subprocess.run([str(env_dir / "bin" / "dex"), "--version"], capture_output=True, text=True, env={})
    assert dex_cli.returncode == 0 and dex_cli.stdout.strip() == "dex, version 0.1.0", dex_cli.stdout + dex_cli.stderr
