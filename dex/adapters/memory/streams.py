"""The in-memory adapter's published values and streams (docs/reference/contract.md §14).

:func:`apply_plan` writes what a workflow task published and streamed, called by the task
completion under the state's lock (so with its history block, atomically); :class:`MemoryStreams`
is the :class:`~dex.app.ports.streams.StreamStore` port: the reads, and the writes of activities.
Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tables import PublishedRow, StreamRow
from dex.app.ports.streams import PublishedRead, RunStreams, StreamPage, StreamSummary
from dex.domain.errors import RunNotFoundError
from dex.domain.values import Payload
from dex.domain.writes import WritePlan


def apply_plan(state: MemoryState, run_id: str, plan: WritePlan) -> None:
    """Write ``plan``'s published values, stream items and closes for ``run_id`` (the caller
    holds the lock and writes the plan's history). An item for a stream that is closed already
    (written by a later generation of a run that continued as new) is not kept: a closed stream
    stays closed for its readers."""
    if plan.published:
        values = state.published.setdefault(run_id, {})
        for key, value in plan.published:
            known = values.get(key)
            values[key] = PublishedRow(value=value, version=1 if known is None else known.version + 1)
    if plan.stream_items or plan.streams_closed:
        streams = state.streams.setdefault(run_id, {})
        for item in plan.stream_items:
            stream = streams.setdefault(item.key, StreamRow())
            if not stream.closed:
                stream.items.append(item.value)
        for key in plan.streams_closed:
            streams.setdefault(key, StreamRow()).closed = True


class MemoryStreams:
    """The stream-store port of the in-memory adapter."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def read_published(self, run_id: str, key: str) -> PublishedRead:
        storable.text(run_id, "run_id")
        storable.text(key, "published value key")
        with self._state.lock:
            run = self._state.runs.get(run_id)
            if run is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            row = self._state.published.get(run_id, {}).get(key)
            if row is None:
                return PublishedRead(value=None, version=0, run_status=run.status)
            return PublishedRead(value=row.value, version=row.version, run_status=run.status)

    def read_stream(self, run_id: str, key: str, after: int, limit: int) -> StreamPage:
        storable.text(run_id, "run_id")
        storable.text(key, "stream key")
        with self._state.lock:
            run = self._state.runs.get(run_id)
            if run is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            stream = self._state.streams.get(run_id, {}).get(key)
            if stream is None:
                return StreamPage(items=(), closed=False, run_status=run.status)
            start = max(after, 0)
            chosen = stream.items[start : start + max(limit, 0)]
            items = tuple((start + i + 1, value) for i, value in enumerate(chosen))
            return StreamPage(items=items, closed=stream.closed, run_status=run.status)

    def run_streams(self, run_id: str) -> RunStreams:
        storable.text(run_id, "run_id")
        with self._state.lock:
            published = tuple((key, row.value) for key, row in sorted(self._state.published.get(run_id, {}).items()))
            streams = tuple(
                StreamSummary(key=key, length=len(row.items), closed=row.closed)
                for key, row in sorted(self._state.streams.get(run_id, {}).items())
            )
            return RunStreams(published=published, streams=streams)

    def write_stream_items(self, run_id: str, items: Sequence[tuple[str, Payload]], now: datetime) -> None:
        storable.text(run_id, "run_id")
        for key, _ in items:
            storable.text(key, "stream key")
        with self._state.lock:
            self._state.live_run(run_id)  # RunNotFoundError, InvalidStateError
            streams = self._state.streams.get(run_id, {})
            for key, _ in items:
                stream = streams.get(key)
                if stream is not None and stream.closed:
                    raise ValueError(f"stream {key!r} is closed: nothing more can be written to it")
            streams = self._state.streams.setdefault(run_id, {})
            for key, value in items:
                streams.setdefault(key, StreamRow()).items.append(value)
