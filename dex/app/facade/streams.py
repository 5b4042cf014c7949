"""Reading what runs publish and stream (docs/reference/contract.md §14), from any process.

:class:`StreamReads` is the service behind ``Engine.get_published``, ``read_stream`` and their
asyncio versions. It reads the store's tables of published values and stream items (never the
history), and waits between reads: woken at once by this engine's own writes (``RunReads``'
flushes), else on a short backoff, 2 ms growing to 50 ms, which bounds how late a reader in
another process sees an item (docs/decisions/stream-reads.md says why this and not
LISTEN/NOTIFY).

On an engine that is not started (tests with ``drain()``), a reader that has no answer yet
drives the engine itself, as ``drain(advance_time=False)`` does (``drive``), so a test needs
no second thread. Outside ``timeout=`` values are wall-clock seconds: for ``get_published``
the wait for a first value; for ``read_stream`` the longest wait for the next item or the
stream's end.

A store that fails while a reader waits (a connection lost) is read again with the same
backoff until the reader's deadline, as ``wait`` does; a ``DexError`` (an unknown run) is an
answer, raised at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from dex.app.facade.reads import ReadFailures, RunReads, run_id_of, wait_seconds
from dex.app.ports.store import Store
from dex.app.ports.streams import PublishedRead, StreamPage
from dex.domain.definitions import PayloadConverter, validate_key
from dex.domain.errors import DexError, InvalidStateError
from dex.domain.values import Payload

log = logging.getLogger("dex.streams")

T = TypeVar("T")

PAGE = 100  # stream items read at a time
FIRST_PAUSE, MAX_PAUSE = 0.002, 0.05


def stream_key(key: object, what: str) -> str:
    """A published value's or stream's key as the calls take it: a storable str of 1 to 256 characters."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__}")
    checked = validate_key(key, what)
    assert checked is not None
    return checked


class _Deadline:
    """A reader's wait: its deadline, its backoff and the store errors it met."""

    def __init__(self, timeout: float | None, run_id: str) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pause = FIRST_PAUSE
        self.failures = ReadFailures(run_id)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def next_pause(self) -> float:
        pause = self.pause
        self.pause = min(self.pause * 1.5, MAX_PAUSE)
        if self.deadline is not None:
            pause = min(pause, max(0.0, self.deadline - time.monotonic()))
        return pause

    def heard(self) -> None:
        """An answer came: the next wait starts short again."""
        self.pause = FIRST_PAUSE

    def timed_out(self, what: str) -> TimeoutError:
        """The ``TimeoutError`` at the deadline (raised from the store's last error, if any)."""
        if self.failures.last is None:
            return TimeoutError(f"{what} within {self.timeout} s")
        return TimeoutError(
            f"{what} within {self.timeout} s: the store was failing ({self.failures.count} read(s) in a row)"
        )


class StreamReads:
    """Reads published values and streams of runs from ``store``; ``drive`` runs one pass of a
    not-started engine (nothing on a started one), ``reads`` says when this engine wrote."""

    def __init__(self, store: Store, converter: PayloadConverter, reads: RunReads, drive: Callable[[], None]) -> None:
        self._store, self._converter, self._reads, self._drive = store, converter, reads, drive

    # -- blocking ------------------------------------------------------------------------------
    def _until(self, read: Callable[[], T | None], wait: _Deadline, what: Callable[[], str]) -> T:
        """``read()`` until it gives an answer (not None), driving a not-started engine and
        waiting between reads; TimeoutError at the deadline."""
        while True:
            seen = self._reads.flushes
            try:
                got = read()
            except DexError:
                raise  # an answer (no such run, an ended run), not a failure of the store
            except Exception as exc:  # noqa: BLE001 - the store failed (a connection, a timeout): read again
                wait.failures.failed(exc)
                got = None
            else:
                wait.failures.succeeded()
            if got is not None:
                wait.heard()
                return got
            if wait.expired():
                raise wait.timed_out(what()) from wait.failures.last
            self._drive()
            self._reads.wait_for_flush(seen, wait.next_pause())

    def get_published(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Any:
        """The latest value the run published under ``key``, waiting up to ``timeout`` for a first one."""
        run_id, key, seconds = run_id_of(run_id), stream_key(key, "published value key"), wait_seconds(timeout)
        wait = _Deadline(seconds, run_id)
        found = self._until(lambda: self._published(run_id, key, 0), wait, lambda: f"run {run_id} published no {key!r}")
        return self._decode(found.value)

    def watch_published(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Iterator[Any]:
        """Every new value the run publishes under ``key`` (the current one first), until the run
        ends; ``timeout``: the longest wait for a change. Checked and read once at the call."""
        run_id, key, seconds = run_id_of(run_id), stream_key(key, "published value key"), wait_seconds(timeout)
        read = functools.partial(self._store.read_published, run_id, key)
        first = self._until(
            read, _Deadline(seconds, run_id), lambda: f"run {run_id} could not be read"
        )  # RunNotFoundError at the call
        return self._watch(run_id, key, seconds, first)

    def _watch(self, run_id: str, key: str, seconds: float | None, first: PublishedRead) -> Iterator[Any]:
        version, current = 0, first
        while True:
            if current.version > version and current.value is not None:
                version = current.version
                yield self._decode(current.value)
            if current.run_status.is_terminal:
                return
            current = self._until(
                functools.partial(self._changed, run_id, key, version),
                _Deadline(seconds, run_id),
                lambda: f"run {run_id} published no new {key!r}",
            )

    def read_stream(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Iterator[Any]:
        """The stream's values in order from the first, ending when it is closed or the run ends."""
        run_id, key, seconds = run_id_of(run_id), stream_key(key, "stream key"), wait_seconds(timeout)
        # RunNotFoundError at the call; a failing store is read again until the deadline
        first = self._until(
            functools.partial(self._read_page, run_id, key, 0),
            _Deadline(seconds, run_id),
            lambda: f"run {run_id} could not be read",
        )
        return self._items(run_id, key, seconds, first)

    def _items(self, run_id: str, key: str, seconds: float | None, page: StreamPage) -> Iterator[Any]:
        after = 0
        while True:
            for _, value in page.items:
                yield self._decode(value)
            if not page.items and (page.closed or page.run_status.is_terminal):
                return
            # a full or partial page: read on at once; an empty one: wait for the next item
            after = page.items[-1][0] if page.items else after
            read = self._read_page if page.items else self._next_page
            page = self._until(
                functools.partial(read, run_id, key, after),
                _Deadline(seconds, run_id),
                lambda: f"stream {key!r} of run {run_id} had no new item",
            )

    # -- the reads, each an answer or None (wait) ----------------------------------------------
    def _published(self, run_id: str, key: str, after_version: int) -> PublishedRead | None:
        found = self._store.read_published(run_id, key)
        if found.value is not None and found.version > after_version:
            return found
        if found.run_status.is_terminal:
            raise InvalidStateError(
                f"run {run_id} ended ({found.run_status.value}) without publishing a value under {key!r}"
            )
        return None

    def _changed(self, run_id: str, key: str, version: int) -> PublishedRead | None:
        found = self._store.read_published(run_id, key)
        return found if found.version > version or found.run_status.is_terminal else None

    def _read_page(self, run_id: str, key: str, after: int) -> StreamPage:
        return self._store.read_stream(run_id, key, after, PAGE)

    def _next_page(self, run_id: str, key: str, after: int) -> StreamPage | None:
        page = self._store.read_stream(run_id, key, after, PAGE)
        return page if page.items or page.closed or page.run_status.is_terminal else None

    def _decode(self, value: Payload | None) -> Any:
        return None if value is None else self._converter.decode(value, None)

    # -- asyncio -------------------------------------------------------------------------------
    async def _until_async(self, read: Callable[[], T | None], wait: _Deadline, what: Callable[[], str]) -> T:
        """``_until`` on an event loop: the reads and the driving run in the default executor."""
        while True:
            try:
                got = await asyncio.to_thread(read)
            except DexError:
                raise
            except Exception as exc:  # noqa: BLE001 - the store failed: read again
                wait.failures.failed(exc)
                got = None
            else:
                wait.failures.succeeded()
            if got is not None:
                wait.heard()
                return got
            if wait.expired():
                raise wait.timed_out(what()) from wait.failures.last
            await asyncio.to_thread(self._drive)
            await asyncio.sleep(wait.next_pause())

    async def get_published_async(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Any:
        run_id, key, seconds = run_id_of(run_id), stream_key(key, "published value key"), wait_seconds(timeout)
        wait = _Deadline(seconds, run_id)
        found = await self._until_async(
            lambda: self._published(run_id, key, 0), wait, lambda: f"run {run_id} published no {key!r}"
        )
        return self._decode(found.value)

    def read_stream_async(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> AsyncIterator[Any]:
        """``read_stream`` for ``async for``; its arguments are checked at the call, the run at
        the first item."""
        run_id, key, seconds = run_id_of(run_id), stream_key(key, "stream key"), wait_seconds(timeout)
        return self._items_async(run_id, key, seconds)

    async def _items_async(self, run_id: str, key: str, seconds: float | None) -> AsyncIterator[Any]:
        after = 0
        page = await asyncio.to_thread(self._read_page, run_id, key, 0)
        while True:
            for _, value in page.items:
                yield self._decode(value)
            if not page.items and (page.closed or page.run_status.is_terminal):
                return
            after = page.items[-1][0] if page.items else after
            read = self._read_page if page.items else self._next_page
            page = await self._until_async(
                functools.partial(read, run_id, key, after),
                _Deadline(seconds, run_id),
                lambda: f"stream {key!r} of run {run_id} had no new item",
            )
