"""The in-memory adapter's engine registry (docs/reference/contract.md §15, :mod:`dex.app.ports.engines`).

The rows are this part's own, each with its expiry, under the shared state's lock. Part of
:class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from dex.adapters.memory.state import MemoryState
from dex.app.ports.engines import EngineInfo, engine_info
from dex.domain.definitions import validate_text


class MemoryEngines:
    """The engines' rows: node id -> (the row, when it expires)."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._rows: dict[str, tuple[EngineInfo, datetime]] = {}

    def heartbeat_engine(self, info: EngineInfo, now: datetime, expires_at: datetime) -> None:
        engine_info(info)  # refused before anything changes, as PostgreSQL refuses the row
        with self._state.lock:
            for node_id, (_, expiry) in list(self._rows.items()):
                if expiry < now:
                    del self._rows[node_id]
            kept = self._rows.get(info.node_id)
            row = info if kept is None else kept[0]
            self._rows[info.node_id] = (attrs.evolve(row, last_seen=now), expires_at)

    def remove_engine(self, node_id: str) -> None:
        validate_text(node_id, "node_id")
        with self._state.lock:
            self._rows.pop(node_id, None)

    def list_engines(self, now: datetime) -> list[EngineInfo]:
        with self._state.lock:
            return [row for node_id, (row, expiry) in sorted(self._rows.items()) if expiry >= now]
