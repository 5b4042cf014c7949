"""docs/how-to/typed-arguments.md runs as written: its Python blocks, in order, in one namespace,
print what the page's comments say they print (a comment at the end of the ``print`` line, or the
comment line right after it)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "typed-arguments.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _expected(block: str) -> list[str]:
    lines = block.splitlines()
    said = []
    for index, line in enumerate(lines):
        if line.startswith("print("):
            same_line = re.search(r"\)  # (.*)$", line)
            if same_line:
                said.append(same_line.group(1))
            else:
                said.append(lines[index + 1].removeprefix("# "))
    return said


def test_the_page_runs_and_prints_what_it_says() -> None:
    pytest.importorskip("pydantic", reason='the page uses pydantic: pip install "dex-engine[pydantic]"')
    blocks = _blocks()
    assert len(blocks) == 3
    page = types.ModuleType("typed_arguments_page")  # dataclasses and type hints look their module up
    sys.modules[page.__name__] = page
    try:
        for block in blocks:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(block, str(PAGE), "exec"), page.__dict__)  # the page's own example
            assert printed.getvalue().splitlines() == _expected(block)
    finally:
        del sys.modules[page.__name__]
