"""The documents cite only what a reader of the repository can open.

The public contract lives in ``docs/reference/contract.md`` (sections §1–§13); no Markdown file
cites a contract kept outside the repository ("SPEC §n", ``SPEC.md``, ``../shared``) or the
project's issue tracker by number, and every document a Markdown file names under ``docs/``
exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OUTSIDE_CITATION = re.compile(r"SPEC\s*§|SPEC\.md|\.\./shared")
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def tracked_markdown() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    return [ROOT / name for name in names if name and (ROOT / name).is_file()]


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in tracked_markdown():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_the_markdown_files_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in tracked_markdown()}
    assert {"README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs/reference/contract.md"} <= names


def test_no_markdown_file_cites_a_contract_outside_the_repository() -> None:
    assert offending_lines(OUTSIDE_CITATION) == []


def test_no_markdown_file_cites_an_issue_number() -> None:
    assert offending_lines(ISSUE_NUMBER) == []


def test_the_documents_named_under_docs_exist() -> None:
    missing = []
    for path in tracked_markdown():
        for match in DOCS_PATH.finditer(path.read_text(encoding="utf-8")):
            if not (ROOT / match.group(0)).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert missing == []


def test_the_contract_keeps_its_section_numbers() -> None:
    text = (ROOT / "docs" / "reference" / "contract.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## §(\d+) ", text, re.MULTILINE)
    assert headings == [str(n) for n in range(1, 14)]


def test_the_patterns_catch_what_they_are_for() -> None:
    # the checks above pass on an empty match; make sure each pattern would fire
    assert OUTSIDE_CITATION.search("as SPEC §8 says")
    assert OUTSIDE_CITATION.search("see ../shared/SPEC.md")
    assert ISSUE_NUMBER.search("measured for issue 26")
    assert not ISSUE_NUMBER.search("docs/reference/contract.md §8")
    named = DOCS_PATH.search("see docs/decisions/batch-window.md.")
    assert named is not None and named.group(0) == "docs/decisions/batch-window.md"
