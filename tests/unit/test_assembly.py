"""The runtime is assembled, not wired: no module of ``dex/app`` sets an attribute of another
object (a part gets what it uses in its constructor; see ``dex.app.runtime.assembly.Runtime``).

Allowed are the records a module keeps of its own work — a watch, a pending message, an
attempt, a round — whose fields its own code fills in, and an exception's cause.

The simulator (``dex/simulation``) drives that runtime through the same constructors
(``Engine(runtime_options=...)``): it reads no private attribute of another object and sets
none of another's attributes — no part rewired, no method replaced — but the fields of its
own records and fault switches."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "dex" / "app"
SIMULATION = APP.parent / "simulation"

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


# (module under dex/simulation, the attribute set): the simulation's own records and switches
SIMULATION_RECORDS = {
    ("ledgers", "claim.until"),  # a lease as the ledger saw it granted (its own Claim)
    ("ledgers", "claim.released"),
    ("referee", "log.last_task_at"),  # what the referee knows of a run (its own RunLog)
    ("referee", "log.history"),
    ("simulator", "node.stalled_until"),  # a flush-stall fault (its own Node)
    ("simulator", "self.store.sabotage"),  # a write-fails or write-ack-lost fault (its ObservedAdapter)
    ("simulator", "node.store.failing"),  # store-errors, store-flaky (its NodeStore)
    ("simulator", "node.store.flaky"),
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


def private_reads_of_others(source: str) -> list[tuple[int, str]]:
    """Each use of a private attribute (``x._name``, not a dunder) of something other than
    ``self``, ``cls`` or ``super()``: its line and the expression."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_private_check_finds_reads_and_settings() -> None:
    source = (
        "def peek(engine):\n"
        "    engine._runtime.arm()\n"
        "    self._mine = super()._theirs\n"
        "    engine.buffer._outcomes = []\n"
        "    return type(engine).__name__\n"
    )
    assert private_reads_of_others(source) == [(2, "engine._runtime"), (4, "engine.buffer._outcomes")]


def test_the_simulator_reads_no_private_attribute_of_another_object() -> None:
    offenders = [
        f"{path.relative_to(SIMULATION.parent.parent)}:{line}: {expression}"
        for path in sorted(SIMULATION.rglob("*.py"))
        for line, expression in private_reads_of_others(path.read_text())
    ]
    assert offenders == [], "use a public property or pass it to the constructor:\n" + "\n".join(offenders)


def test_the_simulator_rewires_nothing_and_replaces_no_method() -> None:
    offenders = [
        f"{path.relative_to(SIMULATION.parent.parent)}:{line}: {target}"
        for path in sorted(SIMULATION.rglob("*.py"))
        for line, _name, target in settings_of_others(path.read_text())
        if (path.relative_to(SIMULATION).with_suffix("").as_posix(), target) not in SIMULATION_RECORDS
    ]
    assert offenders == [], "pass it to the constructor (RuntimeOptions) instead:\n" + "\n".join(offenders)


def test_the_simulator_calls_no_setattr() -> None:
    offenders = [
        f"{path.relative_to(SIMULATION.parent.parent)}:{node.lineno}"
        for path in sorted(SIMULATION.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__")
    ]
    assert offenders == []
