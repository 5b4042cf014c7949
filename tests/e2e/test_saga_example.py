"""``examples/saga.py`` as a user runs it: a saga that compensates, newest step first, when a step
fails and when the run is cancelled (docs/reference/contract.md §14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_saga_compensates_on_failure_and_on_cancel() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "saga.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT)},
        check=True,
    )
    lines = {line.split()[0]: line.split(maxsplit=2)[1:] for line in done.stdout.splitlines()}
    assert lines["happy"] == [
        "COMPLETED",
        "saga-book-flight=completed -> saga-book-hotel=completed -> saga-rent-car=completed",
    ]
    status, steps = lines["no-car"]
    assert status == "FAILED"
    assert steps.endswith("saga-rent-car=failed -> saga-undo=completed -> saga-undo=completed")  # two to undo
    status, steps = lines["cancelled"]
    assert status == "CANCELLED"
    assert steps.endswith("saga-rent-car=completed" + " -> saga-undo=completed" * 3)


def test_the_saga_undoes_newest_first() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import saga  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "examples"))
    import dex
    from dex.adapters.memory import InMemoryAdapter
    from dex.domain import events as ev
    from dex.testing import VirtualClock

    engine = dex.Engine(
        InMemoryAdapter(clock=VirtualClock()),
        workflows=[saga.trip],
        activities=[saga.book_flight, saga.book_hotel, saga.rent_car, saga.undo],
    )
    run_id = engine.start_workflow(saga.trip, "t1")
    engine.drain(advance_time=False)
    engine.cancel(run_id, "changed my mind")
    engine.drain(advance_time=False)
    undone = [
        engine.converter.decode(item.event.input[0])
        for item in engine.history(run_id)
        if isinstance(item.event, ev.ActivityTaskCreated) and item.event.name == "saga-undo"
    ]
    assert undone == ["car-t1", "hotel-t1", "flight-t1"]
    history = engine.history(run_id)
    assert [e.kind for e in history][-2:] == ["RunCompleted", "WorkflowTaskCompleted"]
