"""Tools for testing workflows: a virtual clock, replay of recorded histories, history files."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE, WORKFLOW_ATTRIBUTE
from dex.app.ports.clock import VirtualClock
from dex.domain.definitions import PayloadConverter, WorkflowDefinition
from dex.domain.events import HistoryEvent
from dex.domain.task import check_replay
from dex.serialization.history import decode_exported_history, decode_history
from dex.serialization.payloads import PayloadConverter as DefaultPayloadConverter

__all__ = ["VirtualClock", "load_history", "replay"]


def load_history(data: bytes) -> list[HistoryEvent]:
    """Read a history written by ``Engine.export_history``."""
    return decode_history(data)


def replay(
    workflow_fn: Callable[..., Any],
    history: Sequence[HistoryEvent] | bytes,
    *,
    activities: Iterable[Callable[..., Any]] = (),
    workflows: Iterable[Callable[..., Any]] = (),
    converter: PayloadConverter | None = None,
) -> None:
    """Re-run ``workflow_fn`` against ``history``; raise NonDeterminismError if it no longer fits.

    Pass the activities and child workflows the code calls by name so their type hints and
    options are known, as they are to the engine.
    """
    definition: WorkflowDefinition | None = getattr(workflow_fn, WORKFLOW_ATTRIBUTE, None)
    if definition is None:
        raise TypeError(f"{workflow_fn!r} is not a dex workflow: decorate it with @dex.workflow")
    run_id = "replay"  # replay needs no run id: ctx.random() is seeded from the history
    if isinstance(history, (bytes, bytearray)):
        exported = decode_exported_history(bytes(history))
        run_id, history = exported.run_id, list(exported.events)
    activity_table = {getattr(fn, ACTIVITY_ATTRIBUTE).name: getattr(fn, ACTIVITY_ATTRIBUTE) for fn in activities}
    workflow_table = {getattr(fn, WORKFLOW_ATTRIBUTE).name: getattr(fn, WORKFLOW_ATTRIBUTE) for fn in workflows}
    check_replay(
        definition,
        run_id,
        history,
        converter or DefaultPayloadConverter(),
        activities=activity_table.get,
        workflows=workflow_table.get,
    )
