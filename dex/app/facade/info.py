"""Read models the engine returns: RunInfo; and the outcomes its own writes recorded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from dex.domain.events import RunCompleted
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo


@attrs.frozen(kw_only=True)
class RunInfo:
    """A snapshot of one run; ``result`` is decoded with the workflow's return type hint."""

    run_id: str
    workflow_name: str
    instance_id: str | None
    status: RunStatus
    custom_status: str | None
    priority: int
    concurrency_key: str | None
    labels: Mapping[str, str]
    parent_run_id: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    result: Any
    failure: FailureInfo | None
    code_version: str | None = None  # the version of the engine that started the run (docs/reference/contract.md §11)
    # why its workflow task keeps failing while the run is held (docs/reference/contract.md §11); None when healthy
    task_failure: FailureInfo | None = None
    # the fire time of the schedule that started the run (UTC, before jitter); None otherwise
    scheduled_at: datetime | None = None
    # the run this one is a fork of (``Engine.fork``, docs/reference/contract.md §11); None otherwise
    forked_from: str | None = None
    # when it is cancelled with reason "timeout" (``start_workflow(timeout=)``, docs/reference/contract.md §14)
    deadline: datetime | None = None
    # events it received and never read, counted when it ended (docs/reference/contract.md §14)
    unread_events: int = 0


class Outcomes:
    """The terminal outcomes this engine's own flushes wrote, newest ``capacity`` of them.

    A run's outcome is recorded exactly once and never changes, so once a completion that ends
    a run is written, ``wait`` may answer from here instead of reading the run back: for the
    runs an engine works on itself, waiting costs no round trip. Thread-safe; bounded (the
    oldest entries go first), so it holds nothing a reader could not fetch from the store.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[str, RunCompleted]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, run_id: str, workflow_name: str, outcome: RunCompleted) -> None:
        with self._lock:
            self._entries[run_id] = (workflow_name, outcome)
            self._entries.move_to_end(run_id)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def get(self, run_id: str) -> tuple[str, RunCompleted] | None:
        """``(workflow name, outcome)`` of a run whose end this engine wrote, or None."""
        with self._lock:
            return self._entries.get(run_id)

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._entries)
