"""The asyncio face of the engine: the same calls, awaitable, never blocking the event loop.

Store calls run in the default executor (``asyncio.to_thread``), so an application serving
requests on an event loop (FastAPI, aiohttp) can start, signal and wait for runs without
stalling its loop. ``wait_async`` polls with ``asyncio.sleep``, backing off up to 50 ms, and
retries a read that the store failed until its own deadline, as ``wait`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

from dex.app.info import RunInfo
from dex.app.reads import ReadFailures, outcome_of, wait_seconds
from dex.app.transaction_ports import LoopConnection
from dex.domain import events as ev
from dex.domain.definitions import validate_text
from dex.domain.errors import DexError
from dex.domain.status import RunStatus


class EngineCalls(Protocol):
    """The blocking calls of :class:`dex.Engine` that the awaitable ones run in a thread (the
    engine mixes :class:`AsyncEngineMixin` in, so it sits above this module)."""

    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        connection: Any = None,
    ) -> str: ...

    def send_event(self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None) -> None: ...

    def cancel(self, run_id: str, reason: str = "") -> None: ...

    def suspend(self, run_id: str) -> None: ...

    def resume(self, run_id: str) -> None: ...

    def get_run(self, run_id: str) -> RunInfo: ...

    def list_runs(
        self,
        *,
        workflow_name: str | None = None,
        statuses: Iterable[RunStatus | str] | None = None,
        labels: Mapping[str, str] | None = None,
        instance_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 100,
        code_version: str | None = None,
    ) -> list[RunInfo]: ...

    def history(self, run_id: str) -> list[ev.HistoryEvent]: ...

    def fork(self, run_id: str, at: int | None = None, queue: str | None = None) -> str: ...


class AsyncEngineMixin:
    """Awaitable versions of the engine's calls (mixed into :class:`dex.Engine`)."""

    @property
    def _sync(self) -> EngineCalls:
        return cast(EngineCalls, self)

    async def start_workflow_async(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        connection: Any = None,
    ) -> str:
        """``start_workflow``; ``connection`` is a ``psycopg.AsyncConnection`` here (SPEC §9)."""
        bound = _bound(connection)
        return await asyncio.to_thread(
            lambda: self._sync.start_workflow(
                fn_or_name,
                *args,
                instance_id=instance_id,
                queue=queue,
                priority=priority,
                concurrency_key=concurrency_key,
                labels=labels,
                connection=bound,
            )
        )

    async def send_event_async(
        self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None
    ) -> None:
        bound = _bound(connection)
        await asyncio.to_thread(lambda: self._sync.send_event(run_id, event_id, payload, connection=bound))

    async def cancel_async(self, run_id: str, reason: str = "") -> None:
        await asyncio.to_thread(self._sync.cancel, run_id, reason)

    async def suspend_async(self, run_id: str) -> None:
        await asyncio.to_thread(self._sync.suspend, run_id)

    async def resume_async(self, run_id: str) -> None:
        await asyncio.to_thread(self._sync.resume, run_id)

    async def get_run_async(self, run_id: str) -> RunInfo:
        return await asyncio.to_thread(self._sync.get_run, run_id)

    async def list_runs_async(
        self,
        *,
        workflow_name: str | None = None,
        statuses: Iterable[RunStatus | str] | None = None,
        labels: Mapping[str, str] | None = None,
        instance_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 100,
        code_version: str | None = None,
    ) -> list[RunInfo]:
        return await asyncio.to_thread(
            lambda: self._sync.list_runs(
                workflow_name=workflow_name,
                statuses=statuses,
                labels=labels,
                instance_id=instance_id,
                created_after=created_after,
                created_before=created_before,
                limit=limit,
                code_version=code_version,
            )
        )

    async def history_async(self, run_id: str) -> list[ev.HistoryEvent]:
        return await asyncio.to_thread(self._sync.history, run_id)

    async def fork_async(self, run_id: str, at: int | None = None, queue: str | None = None) -> str:
        """``fork`` (SPEC §11)."""
        return await asyncio.to_thread(self._sync.fork, run_id, at, queue)

    async def wait_async(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
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
                info = await self.get_run_async(run_id)
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
