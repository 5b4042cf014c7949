"""The repository cites only what a reader of it can open.

The public contract lives in ``docs/reference/contract.md`` (sections §1–§13 and the later ones built); no tracked file
(documents, code, tests, benchmarks, scripts) cites a contract kept outside the repository
("SPEC §n", ``SPEC.md``, ``../shared``) or the project's issue tracker by number, and every
document a file names under ``docs/`` exists. Generated code and this file's own patterns aside.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OUTSIDE_CITATION = re.compile(r"SPEC\s*§|SPEC\.md|\.\./shared")
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


THIS_FILE = Path(__file__).resolve()
TEXT_SUFFIXES = {
    ".md",
    ".py",
    ".pyi",
    ".proto",
    ".sh",
    ".js",
    ".html",
    ".css",
    ".toml",
    ".yml",
    ".yaml",
    ".txt",
    ".go",
    ".java",
}


def tracked(pattern: str) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z", "--", pattern], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    return [ROOT / name for name in names if name and (ROOT / name).is_file()]


def tracked_markdown() -> list[Path]:
    return tracked("*.md")


def tracked_text() -> list[Path]:
    """Every tracked text file a reader may open, but generated code and this file."""
    return [
        path
        for path in tracked("*")
        if (path.suffix in TEXT_SUFFIXES or not path.suffix)
        and (ROOT / "dex" / "v1") not in path.parents
        and path != THIS_FILE
    ]


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in tracked_text():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_the_files_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in tracked_text()}
    assert {"README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs/reference/contract.md"} <= names
    assert {"dex/app/facade/engine.py", "tests/conftest.py", "scripts/test.sh", ".ci/run"} <= names
    assert "dex/v1/history_pb2.py" not in names


def test_no_file_cites_a_contract_outside_the_repository() -> None:
    assert offending_lines(OUTSIDE_CITATION) == []


def test_no_file_cites_an_issue_number() -> None:
    assert offending_lines(ISSUE_NUMBER) == []


def test_the_documents_named_under_docs_exist() -> None:
    missing = []
    for path in tracked_text():
        for match in DOCS_PATH.finditer(path.read_text(encoding="utf-8")):
            if not (ROOT / match.group(0)).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert missing == []


def test_the_contract_keeps_its_section_numbers() -> None:
    text = (ROOT / "docs" / "reference" / "contract.md").read_text(encoding="utf-8")
    headings = [int(n) for n in re.findall(r"^## §(\d+) ", text, re.MULTILINE)]
    # §1–§13 in order; a later section is added once something of it is built (§14 may still
    # be planned when §15 is), so the later numbers only increase
    assert headings[:13] == list(range(1, 14))
    assert headings == sorted(set(headings))


def test_the_patterns_catch_what_they_are_for() -> None:
    # the checks above pass on an empty match; make sure each pattern would fire
    assert OUTSIDE_CITATION.search("as SPEC §8 says")
    assert OUTSIDE_CITATION.search("see ../shared/SPEC.md")
    assert ISSUE_NUMBER.search("measured for issue 26")
    assert not ISSUE_NUMBER.search("docs/reference/contract.md §8")
    named = DOCS_PATH.search("see docs/decisions/batch-window.md.")
    assert named is not None and named.group(0) == "docs/decisions/batch-window.md"
