"""The event loop on which ``async def`` activities run: one thread of its own, owned by the
activity worker (:class:`dex.app.activities.worker.ActivityWorker`), so a coroutine activity is
awaited there while the attempt's own thread waits for its outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dex.worker")


class AsyncRunner:
    """An event loop in its own thread, owned by the worker, on which async activities run.

    asyncio lets ``KeyboardInterrupt`` and ``SystemExit`` out of a task through ``run_forever``,
    which would end the loop's thread and leave every later ``async def`` attempt waiting
    forever. So the activity's coroutine runs wrapped: any ``BaseException`` it raises travels
    to the caller as the payload of an ordinary exception and is raised there again, as the
    attempt's failure. Should the thread die anyway, it is logged and the next attempt starts a
    new loop; an attempt waiting on the dead loop fails instead of waiting forever.

    Two ways in: :meth:`run` waits for the coroutine in the calling thread (an inline attempt,
    ``Engine.drain()``), :meth:`start` returns at once and calls back when it has ended (a
    started engine's attempts, which so hold no thread while they await).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._started: set[concurrent.futures.Future[Any]] = set()  # scheduled by start(), not ended

    def run(self, coro: Any, on_future: Callable[[concurrent.futures.Future[Any]], object] | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its outcome. ``on_future`` gets the attempt's
        future as soon as it is scheduled: cancelling that future cancels the coroutine at its
        next await (``asyncio.CancelledError`` there), and this call raises
        ``concurrent.futures.CancelledError`` at once, whatever the coroutine does after."""
        loop, thread = self._running()
        future = asyncio.run_coroutine_threadsafe(_carried(coro), loop)
        if on_future is not None:
            on_future(future)
        while not future.done():
            concurrent.futures.wait([future], timeout=1.0)
            if not future.done() and not thread.is_alive():
                future.cancel()
                raise RuntimeError("the asyncio activity thread died while the attempt ran")
        try:
            return future.result()
        except _Carried as carried:
            raise carried.exc from None

    def start(
        self, coro: Any, done: Callable[[concurrent.futures.Future[Any]], object]
    ) -> concurrent.futures.Future[Any]:
        """Schedule ``coro`` on the loop and return its future at once, holding no thread while
        it runs; ``done(future)`` is called when it has ended: on the loop's thread, or in the
        thread that cancels the future (at once: what the coroutine does after is not waited
        for, as with :meth:`run`). Should the loop's thread die meanwhile, :meth:`check`
        fails the futures it left."""
        loop, _thread = self._running()
        future = asyncio.run_coroutine_threadsafe(_carried(coro), loop)
        with self._lock:
            self._started.add(future)
        future.add_done_callback(self._forget)
        future.add_done_callback(done)
        return future

    def check(self) -> int:
        """If the loop's thread has died, fail the futures of what :meth:`start` scheduled there
        (their ``done`` callbacks run now, with a ``RuntimeError`` saying so) and let the next
        attempt start a new loop; how many it failed. The activity worker's thread calls it
        every round."""
        with self._lock:
            thread = self._thread
            if thread is None or thread.is_alive():
                return 0
            log.error("the asyncio activity thread had died; the attempts it ran have failed")
            self._loop, self._thread = None, None
            left, self._started = list(self._started), set()
        for future in left:
            try:
                future.set_exception(RuntimeError("the asyncio activity thread died while the attempt ran"))
            except concurrent.futures.InvalidStateError:  # it ended meanwhile
                pass
        return len(left)

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._started.discard(future)

    def _running(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        """The loop and its thread, started now if there is none or it died."""
        with self._lock:
            if self._thread is not None and not self._thread.is_alive():
                log.error("the asyncio activity thread had died; starting a new one")
                self._loop, self._thread = None, None
            if self._loop is None or self._thread is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=_run_loop, args=(self._loop,), name="dex-async-activities", daemon=True
                )
                self._thread.start()
            return self._loop, self._thread

    @property
    def alive(self) -> bool:
        """False only when the loop's thread was started and has died."""
        thread = self._thread
        return thread is None or thread.is_alive()

    def close(self, timeout: float = 5) -> None:
        """Stop the loop. Coroutines still running (attempts a stopping engine abandons) are
        cancelled, so the threads waiting for them go on; a loop that a coroutine keeps from
        stopping within ``timeout`` seconds is left to its daemon thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(_cancel_all_and_stop, loop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the asyncio loop of async activities did not stop within %g s; it is left running", timeout)
            return
        loop.close()


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        loop.stop()
        return
    for task in tasks:
        task.cancel()
    asyncio.gather(*tasks, return_exceptions=True).add_done_callback(lambda _f: loop.stop())


class _Carried(Exception):
    """A ``BaseException`` of an async activity, carried out of the event loop as an Exception."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


async def _carried(coro: Any) -> Any:
    try:
        return await coro
    except (Exception, GeneratorExit):  # GeneratorExit: the coroutine is closed (a dead loop's, dropped)
        raise
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/SystemExit would stop the loop
        raise _Carried(exc) from None


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    except BaseException:
        log.critical("the asyncio activity thread died", exc_info=True)
