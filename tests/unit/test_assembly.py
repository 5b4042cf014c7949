"""The runtime is assembled, not wired: no module of ``dex/app`` sets an attribute of another
object (a part gets what it uses in its constructor; see ``dex.app.runtime.assembly.Runtime``).

Allowed are the records a module keeps of its own work — a watch, a pending message, an
attempt, a round — whose fields its own code fills in, and an exception's cause."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "dex" / "app"

# (module under dex/app, the name the record goes by there): records the module owns and fills in
RECORDS = {
    ("machinery/buffer", "pending"),  # a PendingMessage its sender waits on (dex.app.machinery.refusals)
    ("machinery/refusals", "pending"),
    ("activities/leases", "attempt"),  # an attempt under a lease (its own _Attempt)
    ("facade/reads", "error"),  # error.__cause__: an exception raised from another
    ("machinery/watchdog", "watch"),  # its own _Watch
    ("workflows/worker", "round_"),  # a Round of its own (dex.app.workflows.executors)
    ("workflows/worker", "apart"),
}


def settings_of_others(source: str) -> list[tuple[int, str, str]]:
    """Each assignment to an attribute of something other than ``self`` or ``cls``: its line,
    the name of the object (or the expression) and the whole target."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                    base = part.value
                    if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                        continue
                    name = base.id if isinstance(base, ast.Name) else ast.unparse(base)
                    found.append((node.lineno, name, ast.unparse(part)))
    return found


def test_the_check_finds_wiring_by_mutation() -> None:
    source = "def build(buffer, worker):\n    buffer.dispatch = worker\n    self.x = 1\n    worker.hand = print\n"
    assert [(line, name) for line, name, _ in settings_of_others(source)] == [(2, "buffer"), (4, "worker")]


def test_no_module_of_the_app_sets_another_objects_attributes() -> None:
    offenders = [
        f"{path.relative_to(APP.parent.parent)}:{line}: {target}"
        for path in sorted(APP.rglob("*.py"))
        for line, name, target in settings_of_others(path.read_text())
        if (path.relative_to(APP).with_suffix("").as_posix(), name) not in RECORDS
    ]
    assert offenders == [], "pass it to the constructor instead:\n" + "\n".join(offenders)
