"""MkDocs hooks of the documentation site (mkdocs.yml names this file; it is not a page).

- ARCHITECTURE.md and BENCHMARKS.md stay at the repository's root, where a reader of the
  repository looks first; the site shows them as pages of its Explanation section, their links
  (written relative to the root: ``docs/decisions/...``) rewritten to the site's pages.
- Records added to ``docs/decisions/`` and command pages added to ``docs/cli/`` join the nav
  by themselves (after the pages it lists), so a new one needs no edit of mkdocs.yml to be
  found; every other page must be listed (``validation.nav.omitted_files`` fails the build).
- The documents cite each other as plain paths (``docs/reference/contract.md §8``), which
  stay readable in a terminal and checkable by tests/unit/test_docs_references.py; on the site
  such a citation becomes a link, to the section when it names one.
- Docstrings are written for Sphinx-style readers (``:class:`Engine```); the rendered API
  pages drop the role prefix and keep the code.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# root document -> the page of the site that shows it
ROOT_PAGES = {"ARCHITECTURE.md": "explanation/architecture.md", "BENCHMARKS.md": "explanation/benchmarks.md"}
# nav section title -> the folder whose pages join it when the nav does not list them
SELF_LISTING = {"Decisions": "decisions", "Command line": "cli"}

LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
CITATION = re.compile(r"(?<![\w/\[`.-])(?<!\]\()docs/((?:[\w.-]+/)*[\w.-]+\.md)(?: §(\d+))?")
SECTION = re.compile(r"(?<![\w\[])(?<!contract\.md )§(\d+)\b")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
HTML_PIECES = re.compile(r"(<code\b.*?</code>|<a\b.*?</a>|<[^>]+>)", re.DOTALL)
SPHINX_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):<code>(~?)([^<]*)</code>")


def on_config(config: Any) -> Any:
    for title, folder in SELF_LISTING.items():
        section = _find_section(config["nav"], title)
        if section is None:
            continue
        listed = {_entry_path(entry) for entry in section}
        for path in sorted((DOCS / folder).glob("*.md")):
            uri = f"{folder}/{path.name}"
            if uri not in listed:
                section.append(uri)
    return config


def _find_section(items: list[Any], title: str) -> list[Any] | None:
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, list):
                    if key == title:
                        return value
                    found = _find_section(value, title)
                    if found is not None:
                        return found
    return None


def _entry_path(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and len(entry) == 1:
        value = next(iter(entry.values()))
        return value if isinstance(value, str) else None
    return None


def on_files(files: Files, config: Any) -> Files:
    for source, uri in ROOT_PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=_from_root(text, uri)))
    return files


def _from_root(text: str, uri: str) -> str:
    """A root document's text with its links made relative to the page at ``uri``."""
    here = posixpath.dirname(uri) or "."

    def relink(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        if target in ROOT_PAGES:
            site_target = ROOT_PAGES[target]
        elif target.startswith("docs/"):
            site_target = target[len("docs/") :]
        else:
            return match.group(0)  # left for the build's link check to judge
        relative = posixpath.relpath(site_target, here)
        return f"{match.group(1)}{relative}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(relink, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    here = posixpath.dirname(page.file.src_uri) or "."
    sections = _contract_sections()

    def link(match: re.Match[str]) -> str:
        target, section = match.group(1), match.group(2)
        if files.get_file_from_path(target) is None:
            return match.group(0)  # not a page: leave the text alone
        # only the contract's sections are numbered
        anchor = f"#{sections[section]}" if target == "reference/contract.md" and section in sections else ""
        return f"[{match.group(0)}]({posixpath.relpath(target, here)}{anchor})"

    def section_link(match: re.Match[str]) -> str:
        number = match.group(1)
        return f"[§{number}](#{sections[number]})" if number in sections else match.group(0)

    def change(prose: str) -> str:
        prose = CITATION.sub(link, prose)
        if page.file.src_uri == "reference/contract.md":  # "see §11": a section of this very page
            prose = "".join(
                line if line.startswith("#") else SECTION.sub(section_link, line)
                for line in prose.splitlines(keepends=True)
            )
        return prose

    return _outside_code(markdown, change)


def _contract_sections() -> dict[str, str]:
    text = (DOCS / "reference" / "contract.md").read_text(encoding="utf-8")
    return {number: slugify(heading, "-") for heading, number in re.findall(r"^## (§(\d+) .*)$", text, re.MULTILINE)}


def _outside_code(markdown: str, change: Any) -> str:
    """``markdown`` with ``change`` applied to its prose: fenced blocks and code spans are left
    as they are (the documents put their code in fences, none in indented blocks)."""
    out: list[str] = []
    prose: list[str] = []
    fence: str | None = None

    def flush() -> None:
        if prose:
            block = "".join(prose)
            pieces, last = [], 0
            for span in CODE_SPAN.finditer(block):
                pieces.append(change(block[last : span.start()]))
                pieces.append(span.group(0))
                last = span.end()
            pieces.append(change(block[last:]))
            out.append("".join(pieces))
            prose.clear()

    for line in markdown.splitlines(keepends=True):
        opening = FENCE.match(line)
        if fence is not None:
            out.append(line)
            if opening and opening.group(1) == fence:
                fence = None
        elif opening:
            flush()
            fence = opening.group(1)
            out.append(line)
        else:
            prose.append(line)
    flush()
    return "".join(out)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    # Sphinx's ``~a.b.C`` shows ``C``
    html = SPHINX_ROLE.sub(
        lambda m: f"<code>{m.group(2).rpartition('.')[2] if m.group(1) else m.group(2)}</code>", html
    )
    if not page.file.src_uri.startswith("reference/api/"):
        return html  # pages written in Markdown had their citations linked before rendering
    sections = _contract_sections()

    def link(match: re.Match[str]) -> str:
        target = files.get_file_from_path(match.group(1))
        if target is None:
            return match.group(0)
        section = match.group(2)
        anchor = f"#{sections[section]}" if section in sections and match.group(1) == "reference/contract.md" else ""
        return f'<a href="{get_relative_url(target.url, page.url)}{anchor}">{match.group(0)}</a>'

    # docstrings cite as the documents do; link them in the text, not in code, links or tags
    return "".join(piece if piece.startswith("<") else CITATION.sub(link, piece) for piece in HTML_PIECES.split(html))
