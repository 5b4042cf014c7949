"""Migrations are history (STYLE "The run-time layer"): each one is frozen once released.

A released migration's module imports nothing and holds its SQL as literal text, so no change
to the live code can change what it applies; its text is pinned here by a checksum, so an edit
to a released migration fails at once, without a database (the schema snapshot of
``tests/integration/test_migrations.py`` pins what the texts make). A new migration appends a
line to :data:`FROZEN`; an existing line never changes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest

from dex.adapters.postgres import migrations
from dex.adapters.postgres.migrations import LATEST_VERSION, MIGRATIONS

PACKAGE = Path(migrations.__file__).parent

# version -> sha256 of json.dumps(list of the migration's statements)
FROZEN = {
    1: "a8966b1bf81259d029bb8a885dd99219ff900bf824c6ea481a6b4f3257e52886",
    2: "5a66f38ade9b2c8ba45f9089305e35b17225638e4312cad8b7971a219ffe28fc",
    3: "5984522e0c0b04790db99b757b7c2ae19d4f438b7e324290973c02a4197455e1",
    4: "7854023d43944f3143143316bda1789fced614e539deec44741acdf0c83c99ea",
    5: "de239d45b45b14f6c87ccd9a6be391dee3d9c6ec68db57bbe486e1b568c16840",
    6: "fbd2380e8bf8af8379042def7fd8917c2ca81afa3d3fcfab596dc7f95791f628",
    7: "2438087012c359b53a3ad224f4ba97d8b5424a1c259a4b90c558522d40e35714",
    8: "4dda64f3c969bfeddaf9453005c7209085a8f8b6025d9153e8896e3b2ca08a59",
    9: "bc9b1f353bd53be04f3c8df693998dee3fb12d570d50fc7597135fe6e279c2ab",
    10: "d33848e0bbcd66b4eaf5e67ffd672ab03549b205e7fd7a42372f168d78b2c598",
    11: "6b18552388baaf4fc8183f79b0c23ae3fddf5feef03904b200f1f8fe4116d5e2",
    12: "63147dc9c1572ceb4a67ef9315deca045fbe8f47b2390b62844aa19f0ac8de62",
    13: "dabb93dc28a2fd8a8c626b84460ff1be5db95d38652070b01227852a6ff5e400",
    14: "768fb160c7122c6e2434e6250154fe545748706bfc8dbd7e35f7f0649f1fa18b",
    15: "a45850485366387a19ed22d45d70ad13bd9ee92c75d8f036f50762edf278aabe",
    16: "72b6078faf94654cfa9374534a6c5eb63511ffa10ad0a335af8a27fcce9cbb54",
    17: "5325924777e719bc750039d9cee3f94f768973a2205740dfe06382c884bc5e3b",
    18: "b74be4071c7e0456b01e3ef613c3aaec05ef0e3c63eaaaebefd8fb46469e0efc",
    19: "66a26828d4f487ba065016f9dd191ef10cb076b0fea160b3d8ddd15f30155c1c",
}


def checksum(statements: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(list(statements)).encode()).hexdigest()


def migration_files() -> list[Path]:
    return sorted(PACKAGE.glob("m*_*.py"), key=lambda path: int(re.findall(r"\d+", path.name)[0]))


def test_versions_are_numbered_one_by_one_and_each_has_its_module() -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    assert [int(re.findall(r"\d+", path.name)[0]) for path in migration_files()] == list(range(1, LATEST_VERSION + 1))


def test_released_migrations_keep_their_text() -> None:
    changed = [version for version, statements in MIGRATIONS if checksum(statements) != FROZEN.get(version)]
    assert changed == [], (
        f"the SQL of migration(s) {changed} differs from what was released (or a new one has no checksum yet): "
        "databases made with the old text would differ from new ones. Undo the edit and add a new migration instead; "
        "for a new migration, add its checksum to FROZEN"
    )


@pytest.mark.parametrize("path", migration_files(), ids=lambda path: path.stem)
def test_a_migration_imports_nothing_and_holds_only_literal_text(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports == [], f"{path.name} imports: a migration must not use code that later versions may change"
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            continue
        assert isinstance(node, ast.Assign | ast.AnnAssign), f"{path.name}: only VERSION and STATEMENTS, no code"
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        assert isinstance(target, ast.Name) and node.value is not None
        # literal_eval refuses names, calls, f-strings and operators: the text is written out in full
        values[target.id] = ast.literal_eval(node.value)
    assert set(values) == {"VERSION", "STATEMENTS"}
    assert (values["VERSION"], values["STATEMENTS"]) in MIGRATIONS
    assert all(isinstance(statement, str) and statement.strip() for statement in values["STATEMENTS"])
