"""The asyncio face of the engine: the same calls, awaitable, never blocking the event loop.

:class:`AsyncCalls` is the service behind ``Engine``'s ``*_async`` methods: it runs the same
services the blocking calls use. Store calls run in the default executor
(``asyncio.to_thread``), so an application serving requests on an event loop (FastAPI,
aiohttp) can start, signal and wait for runs without stalling its loop. ``wait_async`` polls
with ``asyncio.sleep``, backing off up to 50 ms, and retries a read that the store failed
until its own deadline, as ``wait`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from dex.app.facade.fork import Forks
from dex.app.facade.info import RunInfo
from dex.app.facade.messages import RunMessages
from dex.app.facade.reads import ReadFailures, RunReads, outcome_of, wait_seconds
from dex.app.facade.starts import Starts
from dex.app.facade.steps import ActivityStep
from dex.app.ports.store import RunFilter
from dex.app.ports.transactions import LoopConnection
from dex.domain import events as ev
from dex.domain.definitions import validate_text
from dex.domain.errors import DexError
from dex.domain.status import RunStatus


class AsyncCalls:
    """Awaitable versions of the engine's calls (each ``Engine.<call>_async`` is ``<call>``
    here), over the services its blocking calls use."""

    def __init__(self, starts: Starts, messages: RunMessages, reads: RunReads, forks: Forks) -> None:
        self._starts = starts
        self._messages = messages
        self._reads = reads
        self._forks = forks

    async def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        connection: Any = None,
        timeout: timedelta | float | None = None,
        id_reuse: str = "allow",
        debounce: timedelta | None = None,
        debounce_max: timedelta | None = None,
    ) -> str:
        """``start_workflow``; ``connection`` is a ``psycopg.AsyncConnection`` here (docs/reference/contract.md §9)."""
        bound = _bound(connection)
        return await asyncio.to_thread(
            self._starts.start_workflow,
            fn_or_name,
            args,
            instance_id,
            queue,
            priority,
            concurrency_key,
            labels,
            bound,
            timeout,
            id_reuse,
            debounce,
            debounce_max,
        )

    async def send_event(self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None) -> None:
        bound = _bound(connection)
        await asyncio.to_thread(lambda: self._messages.send_event(run_id, event_id, payload, connection=bound))

    async def cancel(self, run_id: str, reason: str = "") -> None:
        await asyncio.to_thread(self._messages.cancel, run_id, reason)

    async def suspend(self, run_id: str) -> None:
        await asyncio.to_thread(self._messages.suspend, run_id)

    async def resume(self, run_id: str) -> None:
        await asyncio.to_thread(self._messages.resume, run_id)

    async def get_run(self, run_id: str) -> RunInfo:
        return await asyncio.to_thread(self._reads.get_run, run_id)

    async def list_runs(self, run_filter: RunFilter) -> list[RunInfo]:
        return await asyncio.to_thread(self._reads.list_runs, run_filter)

    async def history(self, run_id: str) -> list[ev.HistoryEvent]:
        return await asyncio.to_thread(self._reads.history, run_id)

    async def activity_steps(self, run_id: str) -> list[ActivityStep]:
        return await asyncio.to_thread(self._reads.activity_steps, run_id)

    async def fork(self, run_id: str, at: int | None = None, queue: str | None = None) -> str:
        """``fork`` (docs/reference/contract.md §11)."""
        return await asyncio.to_thread(self._forks.fork, run_id, at, queue)

    async def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Like ``wait``: the result, or WorkflowFailedError / WorkflowCancelledError / TimeoutError.

        A store error (anything but a ``DexError``) is retried until the deadline, as ``wait`` does.
        """
        timeout = wait_seconds(timeout)
        run_id = validate_text(run_id, "run_id")  # a bad id is the caller's mistake, not the store's to retry
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        failures = ReadFailures(run_id)
        status: RunStatus | None = None
        while True:
            try:
                info = await self.get_run(run_id)
            except DexError:
                raise  # an answer (no such run), not a failure of the store
            except Exception as exc:  # noqa: BLE001 - the store failed (a connection, a timeout): read again
                failures.failed(exc)
            else:
                failures.succeeded()
                status = info.status
                if info.status.is_terminal:
                    return outcome_of(run_id, info.status, info.result, info.failure)
            if deadline is not None and time.monotonic() >= deadline:
                raise failures.timed_out(timeout, status)
            await asyncio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.05)


def _bound(connection: object) -> LoopConnection | None:
    """The caller's asynchronous connection with its running loop: the store sends its
    statements on that loop while this coroutine awaits the thread doing the call."""
    return None if connection is None else LoopConnection(connection, asyncio.get_running_loop())
