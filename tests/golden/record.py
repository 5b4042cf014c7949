"""Record the golden histories: ``PYTHONPATH=. python tests/golden/record.py``.

Runs each workflow of ``tests/golden/workflows.py`` on an in-memory engine with a virtual
clock and writes its exported history (a protobuf ``dex.v1.WorkflowHistory``) next to this
file. Re-record only to add a golden file; rewriting an existing one hides exactly the
incompatibility it exists to catch.
"""

from __future__ import annotations

import random
import sys
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain import events as ev
from dex.testing import VirtualClock
from tests.golden.workflows import ACTIVITIES, WORKFLOWS, Shipment, Tier, approval, order, parent, patched, typed

HERE = Path(__file__).resolve().parent


def _engine() -> dex.Engine:
    clock = VirtualClock(datetime(2024, 1, 1, tzinfo=UTC))
    return dex.Engine(InMemoryAdapter(clock=clock), workflows=WORKFLOWS, activities=ACTIVITIES, rng=random.Random(0))


def _finished(engine: dex.Engine, run_id: str) -> str:
    info = engine.get_run(run_id)
    if info.status is not dex.RunStatus.COMPLETED:
        raise SystemExit(f"{info.workflow_name} ended {info.status.value}: {info.failure}")
    return run_id


def record_order() -> dict[str, bytes]:
    engine = _engine()
    run_id = engine.start_workflow(order, {"item": "lamp", "quantity": 2, "extras": ["bulb", "shade"]})
    engine.drain()
    return {"order": engine.export_history(_finished(engine, run_id))}


def record_approval() -> dict[str, bytes]:
    engine = _engine()
    run_id = engine.start_workflow(approval, "budget-2024")
    # sent before the run waits: buffered, then taken first in, first out
    engine.send_event(run_id, "approve", "alice")
    engine.send_event(run_id, "approve", "bob")
    engine.drain(advance_time=False)  # the run now sleeps
    engine.send_event(run_id, "comment", "arrived during the timer")
    engine.drain()
    return {"approval": engine.export_history(_finished(engine, run_id))}


def record_parent() -> dict[str, bytes]:
    engine = _engine()
    run_id = engine.start_workflow(parent, 3)
    engine.drain()
    first_child = next(
        item.event.child_run_id for item in engine.history(run_id) if isinstance(item.event, ev.ChildRunCreated)
    )
    return {
        "parent": engine.export_history(_finished(engine, run_id)),
        "child": engine.export_history(_finished(engine, first_child)),
    }


def record_patched() -> dict[str, bytes]:
    engine = _engine()
    run_id = engine.start_workflow(patched, "lamp")
    engine.drain()
    return {"patched": engine.export_history(_finished(engine, run_id))}


def record_typed() -> dict[str, bytes]:
    engine = _engine()
    shipment = Shipment(
        shipment_id=uuid.UUID("5b0c8c0e-3b1e-4c57-9a36-0b8f6f1c2d4e"),
        ready=datetime(2024, 1, 2, 8, 30, tzinfo=UTC),
        due=date(2024, 1, 5),
        window=timedelta(hours=3, microseconds=250),
        value=Decimal("1999.90"),
        tier=Tier.GOLD,
        labels=frozenset({"fragile", "this-side-up", "heavy"}),
        manifest=b"\x00manifest\xff",
        legs=("LYS", "CDG", "JFK"),
        note=7,
    )
    run_id = engine.start_workflow(typed, shipment)
    engine.drain()
    return {"typed": engine.export_history(_finished(engine, run_id))}


def main(argv: list[str]) -> int:
    only = set(argv)
    for recorder in (record_order, record_approval, record_parent, record_patched, record_typed):
        for name, data in recorder().items():
            if only and name not in only:
                continue
            path = HERE / f"{name}.binpb"
            path.write_bytes(data)
            print(f"wrote {path.relative_to(HERE.parents[1])} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
