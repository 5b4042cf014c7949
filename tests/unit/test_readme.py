"""The README's example runs and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_runs_as_documented() -> None:
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    source = code.group(1)
    assert len(source.strip().splitlines()) <= 32
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
    assert out.getvalue().strip() == "{'charge': 'charge-A-1', 'parcel': 'parcel-A-1'}"


def test_readme_names_the_commands_ci_runs() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci
    assert "bash scripts/test.sh" in README.read_text()
    assert "bash scripts/demo.sh" in README.read_text()
