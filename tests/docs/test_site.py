"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
page left out of the nav, every API page rendered from the docstrings.

mkdocs comes with the ``test`` extra (through ``docs``), so a missing mkdocs fails here rather
than skipping: the site is checked on every run of the suite. The site's hook (docs/hooks.py)
is tested on its own below, on inputs where each of its rewrites must fire.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        # not --quiet: it drops the warnings before --strict counts them, and the build passes
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        # mkdocs-material announces MkDocs 2 on every build; the variable silences that banner only
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def text_of(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def test_the_site_builds_strictly_with_the_four_sections(site: Path) -> None:
    for section in ("tutorial", "how-to", "reference", "explanation"):
        assert (site / section / "index.html").is_file(), section
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Tutorial" in home and "How-to guides" in home and "Explanation" in home


def test_the_api_reference_is_rendered_from_the_docstrings(site: Path) -> None:
    engine = text_of(site, "reference/api/engine")
    assert "start_workflow" in engine and "Create a run and return its id" in engine
    assert 'id="dex.Engine.buffer"' not in engine  # the runtime's parts stay out
    assert "Re-run" in text_of(site, "reference/api/testing")  # dex.testing.replay's docstring
    assert "PostgresAdapter" in text_of(site, "reference/api/adapters")
    assert ":class:" not in engine and ":mod:" not in text_of(site, "reference/api/web")


def test_citations_of_the_documents_become_links_to_their_sections(site: Path) -> None:
    section8 = '<a href="../../reference/contract/#8-the-engine-at-run-time">docs/reference/contract.md §8</a>'
    assert section8 in text_of(site, "how-to/write-activities")  # written in Markdown
    assert '<a href="../../contract/#11-changing-code-safely">docs/reference/contract.md §11</a>' in text_of(
        site, "reference/api/engine"
    )  # written in a docstring
    assert '<a href="#11-changing-code-safely">§11</a>' in text_of(site, "reference/contract")  # the contract's own


def test_the_root_documents_are_pages_with_their_links_made_site_relative(site: Path) -> None:
    architecture = text_of(site, "explanation/architecture")
    assert 'href="../../decisions/batch-window/"' in architecture
    assert "Benchmarks" in text_of(site, "explanation/benchmarks")


def test_the_dashboards_docs_link_leads_to_a_built_page(site: Path) -> None:
    pytest.importorskip("starlette", reason="dex.web needs the web extra")
    from dex.web.docs_link import DASHBOARD_PAGE

    assert "The dashboard and the JSON API" in text_of(site, DASHBOARD_PAGE.rstrip("/"))


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hook_relinks_root_documents_for_their_page() -> None:
    relinked = hooks()._from_root(
        "[a](docs/decisions/batch-window.md#why), [b](BENCHMARKS.md), [c](https://example.com/docs/index.md), [d](x.py)",
        "explanation/architecture.md",
    )
    assert relinked == (
        "[a](../decisions/batch-window.md#why), [b](benchmarks.md), [c](https://example.com/docs/index.md), [d](x.py)"
    )


def test_the_hook_leaves_code_alone() -> None:
    upper = hooks()._outside_code
    text = "a docs/index.md `docs/index.md` b\n```\ndocs/index.md\n```\nc docs/index.md\n"
    assert upper(text, str.upper) == "A DOCS/INDEX.MD `docs/index.md` B\n```\ndocs/index.md\n```\nC DOCS/INDEX.MD\n"


def test_the_hook_adds_new_records_and_commands_to_the_nav() -> None:
    nav = [{"Explanation": [{"Decisions": ["decisions/README.md"]}]}, {"Command line": ["cli/README.md"]}]
    config = hooks().on_config({"nav": nav})
    decisions = config["nav"][0]["Explanation"][0]["Decisions"]
    assert "decisions/batch-window.md" in decisions and decisions.count("decisions/README.md") == 1
    assert "cli/web.md" in config["nav"][1]["Command line"]
