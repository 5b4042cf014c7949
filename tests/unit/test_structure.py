"""The package keeps a shape a reader can hold: an import graph without cycles.

No module under ``dex/`` (but the generated ``dex/v1``) imports itself back through others
(modules are split along seams, not to a line count: STYLE "Size and words"). The import graph is read from
each module's AST, so imports under ``if TYPE_CHECKING:`` and inside functions count too: a
type-only cycle is still two modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "dex"
GENERATED = PACKAGE_ROOT / "v1"


def package_modules(root: Path = PACKAGE_ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if GENERATED not in p.parents)


def module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, name: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that ``source`` (module ``name``) imports, relative ones resolved.

    ``from m import n`` imports the module ``m.n`` when there is one, else the module ``m``.
    Importing a module does not count as importing its parent packages: ``dex/__init__``
    re-exports the engine and every module lies below it, so that would make all one cycle.
    """
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    yield f"{target}.{alias.name}"
                elif target in known:
                    yield target


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules it imports, for ``sources``: module name -> (source, is_package)."""
    known = set(sources)
    return {
        name: set(imported_modules(source, name, is_package, known)) - {name}
        for name, (source, is_package) in sources.items()
    }


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (as the list of its modules, in import order) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan; the graph is small enough to recurse
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_through(sorted(c), graph) for c in components]


def _cycle_through(component: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return component  # unreachable for a strongly connected component


def _package_graph() -> dict[str, set[str]]:
    paths = package_modules()
    return import_graph({module_name(p): (p.read_text(), p.name == "__init__.py") for p in paths})


def test_the_checks_see_the_whole_package() -> None:
    graph = _package_graph()
    assert len(graph) >= 80
    assert "dex.v1.history_pb2" not in graph
    assert "dex.domain.events" in graph["dex.domain.state"]


def test_the_package_has_no_import_cycles() -> None:
    assert find_cycles(_package_graph()) == []


def _graph_of(modules: dict[str, str]) -> dict[str, set[str]]:
    return import_graph({name: (source, False) for name, source in modules.items()})


@pytest.mark.parametrize(
    ("modules", "cycles"),
    [
        ({"p.a": "from p.b import B", "p.b": "from p.a import A"}, [["p.a", "p.b", "p.a"]]),
        (
            {
                "p.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B",
                "p.b": "def f():\n    from . import a",
            },
            [["p.a", "p.b", "p.a"]],
        ),
        (
            {"p.a": "from .b import B", "p.b": "import p.c", "p.c": "from ..p.a import A", "p.d": "from p.a import A"},
            [["p.a", "p.b", "p.c", "p.a"]],
        ),
        ({"p.a": "from p.b import B", "p.b": "from p.c import C", "p.c": "import json"}, []),
        ({"p.a": "from p import b", "p.b": "import json", "p": ""}, []),
    ],
)
def test_the_cycle_check_catches_what_it_must(modules: dict[str, str], cycles: list[list[str]]) -> None:
    assert find_cycles(_graph_of(modules)) == cycles
