"""Dependencies point inwards: domain <- app <- adapters (STYLE "The shape", docs/reference/contract.md §1).

``dex/domain`` imports only the standard library, attrs and itself; nothing in ``dex/domain``
or ``dex/app`` imports an adapter. The checks read each module's AST, so imports under
``if TYPE_CHECKING:`` and inside functions count too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "dex"
DOMAIN_ALLOWED_THIRD_PARTY = {"attrs"}


def modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE_ROOT / subpackage).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, name: str, is_package: bool) -> Iterator[str]:
    """Every module ``source`` imports, relative imports resolved against module ``name``."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target
            # `from dex import adapters` imports the module dex.adapters
            for alias in node.names:
                yield f"{target}.{alias.name}"


def _imports_of(path: Path) -> list[str]:
    return list(imported_modules(path.read_text(), module_name(path), path.name == "__init__.py"))


def domain_violations(imports: list[str]) -> list[str]:
    bad = []
    for target in imports:
        top = target.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or top in DOMAIN_ALLOWED_THIRD_PARTY:
            continue
        if target == "dex.domain" or target.startswith("dex.domain."):
            continue
        if target == "dex":
            # `from dex import x` is judged by the dex.x entry that follows it
            continue
        bad.append(target)
    return bad


def adapter_imports(imports: list[str]) -> list[str]:
    return [t for t in imports if t == "dex.adapters" or t.startswith("dex.adapters.")]


def test_the_package_has_the_layers_this_test_checks() -> None:
    assert len(modules("domain")) >= 5
    assert len(modules("app")) >= 3
    assert (PACKAGE_ROOT / "adapters").is_dir()


@pytest.mark.parametrize("path", modules("domain"), ids=lambda p: p.name)
def test_domain_imports_only_the_standard_library_attrs_and_itself(path: Path) -> None:
    assert domain_violations(_imports_of(path)) == []


@pytest.mark.parametrize("path", modules("domain") + modules("app"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_domain_and_app_never_import_an_adapter(path: Path) -> None:
    assert adapter_imports(_imports_of(path)) == []


def _under(imports: list[str], packages: tuple[str, ...]) -> list[str]:
    return [t for t in imports if any(t == p or t.startswith(p + ".") for p in packages)]


@pytest.mark.parametrize(
    "path", modules("views") + modules("web") + modules("remote"), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_the_outer_layers_share_views_and_never_import_the_command_line(path: Path) -> None:
    """``dex.cli`` is the outermost layer: the dashboard and the remote workers' API stand beside
    it, and what both show lives below them in ``dex.views``."""
    assert _under(_imports_of(path), ("dex.cli",)) == []


@pytest.mark.parametrize("path", modules("views"), ids=lambda p: p.name)
def test_views_import_no_adapter_and_no_outer_layer(path: Path) -> None:
    assert _under(_imports_of(path), ("dex.adapters", "dex.web", "dex.remote", "dex.cli", "dex.simulation")) == []


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("import psycopg", ["psycopg"]),
        ("from google.protobuf import message", ["google.protobuf", "google.protobuf.message"]),
        ("from dex.app.facade.engine import Engine", ["dex.app.facade.engine", "dex.app.facade.engine.Engine"]),
        ("from dex import serialization", ["dex.serialization"]),
        ("from .. import app", ["dex.app"]),
        ("from ..adapters.memory import store", ["dex.adapters.memory", "dex.adapters.memory.store"]),
        ("if TYPE_CHECKING:\n    import cattrs", ["cattrs"]),
        ("def f():\n    import attr_helpers", ["attr_helpers"]),
        ("import json, attrs\nfrom typing import Any\nfrom . import events\nfrom dex.domain.retry import X", []),
        ("from __future__ import annotations", []),
    ],
)
def test_the_domain_check_catches_what_it_must(source: str, bad: list[str]) -> None:
    # as if the source were dex/domain/replay.py
    assert domain_violations(list(imported_modules(source, "dex.domain.replay", False))) == bad


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("import dex.adapters.memory", ["dex.adapters.memory"]),
        ("from dex import adapters", ["dex.adapters"]),
        (
            "from ...adapters.memory import InMemoryAdapter",
            ["dex.adapters.memory", "dex.adapters.memory.InMemoryAdapter"],
        ),
        ("from dex.app.ports.store import Store\nfrom . import clock", []),
    ],
)
def test_the_adapter_check_catches_what_it_must(source: str, bad: list[str]) -> None:
    # as if the source were dex/app/facade/engine.py
    assert adapter_imports(list(imported_modules(source, "dex.app.facade.engine", False))) == bad


# dex/app's packages, from the top down: a module may import its own package and those below it
APP_LAYERS = ("facade", "runtime", "workflows", "activities", "machinery", "schedules", "definitions", "ports")


def app_layer_violations(name: str, imports: list[str]) -> list[str]:
    """The imports of module ``name`` (in ``dex.app.<package>``) that run up to a higher package."""
    own = APP_LAYERS.index(name.split(".")[2])
    bad = []
    for target in imports:
        parts = target.split(".")
        if parts[:2] != ["dex", "app"] or len(parts) < 3 or parts[2] not in APP_LAYERS:
            continue
        if APP_LAYERS.index(parts[2]) < own:
            bad.append(target)
    return bad


def test_dex_app_is_made_of_its_packages() -> None:
    loose = sorted(p.name for p in (PACKAGE_ROOT / "app").glob("*.py") if p.name != "__init__.py")
    packages = sorted(p.name for p in (PACKAGE_ROOT / "app").iterdir() if (p / "__init__.py").is_file())
    assert loose == []
    assert packages == sorted(APP_LAYERS)


@pytest.mark.parametrize("package", APP_LAYERS)
def test_each_app_package_says_what_it_owns_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE_ROOT / "app" / package / "__init__.py").read_text())) or ""
    assert "Owns " in doc
    assert "May import" in doc


@pytest.mark.parametrize(
    "path", [p for p in modules("app") if p.parent.name in APP_LAYERS], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_no_app_import_runs_up_a_layer(path: Path) -> None:
    assert app_layer_violations(module_name(path), _imports_of(path)) == []


@pytest.mark.parametrize(
    ("name", "source", "bad"),
    [
        (
            "dex.app.ports.store",
            "from dex.app.facade.engine import Engine",
            ["dex.app.facade.engine", "dex.app.facade.engine.Engine"],
        ),
        ("dex.app.workflows.worker", "from ..runtime import rounds", ["dex.app.runtime", "dex.app.runtime.rounds"]),
        (
            "dex.app.activities.worker",
            "from dex.app.workflows.held import give_back",
            ["dex.app.workflows.held", "dex.app.workflows.held.give_back"],
        ),
        ("dex.app.workflows.worker", "from dex.app.activities.worker import ActivityWorker\nfrom . import held", []),
        ("dex.app.facade.engine", "from dex.app.runtime.assembly import Runtime\nimport dex.domain.events", []),
    ],
)
def test_the_app_layer_check_catches_what_it_must(name: str, source: str, bad: list[str]) -> None:
    assert app_layer_violations(name, list(imported_modules(source, name, False))) == bad
