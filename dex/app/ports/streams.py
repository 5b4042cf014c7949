"""The port of published values and streams (docs/reference/contract.md §14): what a store keeps
of ``ctx.publish`` and ``ctx.write_stream``, and how the outside reads it.

A store writes a task's published values and stream items in the same transaction as its history
block (from the :class:`~dex.domain.writes.WritePlan`), keeps the latest value per key and the
items of each stream numbered 1, 2, 3 ... in the order they were written, and reads them without
touching the history. Every read answers with the run's status from the same snapshot, so a reader
that has read everything of a run that has ended knows nothing more can come.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import attrs

from dex.domain.status import RunStatus
from dex.domain.values import Payload


@attrs.frozen(kw_only=True)
class PublishedRead:
    """A run's published value under one key, read with the run's status: ``value`` None when
    nothing was published under it yet; ``version`` counts the publishes of the key (0: none)."""

    value: Payload | None
    version: int
    run_status: RunStatus


@attrs.frozen(kw_only=True)
class StreamPage:
    """Items of one stream after a position, in order, with what a reader needs to know whether
    more may come: whether the stream is closed and the run's status, read in the same snapshot."""

    items: tuple[tuple[int, Payload], ...]
    """(position, value) pairs; positions count from 1, without gaps, in the order written."""
    closed: bool
    run_status: RunStatus


@attrs.frozen(kw_only=True)
class StreamSummary:
    """One stream of a run: how many items it holds and whether it is closed."""

    key: str
    length: int
    closed: bool


@attrs.frozen(kw_only=True)
class RunStreams:
    """Everything a run published and streamed, by key (for the dashboard and ``dex runs show``)."""

    published: tuple[tuple[str, Payload], ...]
    """The latest value per key, by key."""
    streams: tuple[StreamSummary, ...]
    """The run's streams, by key."""


class StreamStore(Protocol):
    def read_published(self, run_id: str, key: str) -> PublishedRead:
        """The latest value the run published under ``key``. RunNotFoundError for an unknown run."""
        ...

    def read_stream(self, run_id: str, key: str, after: int, limit: int) -> StreamPage:
        """At most ``limit`` items of the run's stream ``key`` with positions above ``after``,
        read through an index on (run, key, position). RunNotFoundError for an unknown run."""
        ...

    def run_streams(self, run_id: str) -> RunStreams:
        """What the run published and streamed (an unknown run has nothing)."""
        ...

    def write_stream_items(self, run_id: str, items: Sequence[tuple[str, Payload]], now: datetime) -> None:
        """Append items to the run's streams, all or nothing (an activity's writes, outside any
        workflow task). RunNotFoundError for an unknown run, InvalidStateError for a run that
        has ended, ValueError for a closed stream; nothing is written then."""
        ...
