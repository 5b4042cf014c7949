"""Background threads for ``Engine.start()``: each one calls a component's step in a loop.

The threads hold no logic of their own. A shared ``wake`` event lets whoever creates work in
this process (a started workflow, a flushed batch) nudge the pollers instead of waiting for
their next poll.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

log = logging.getLogger("dex.runner")

T = TypeVar("T")


class Nudge:
    """A wake-up call shared by the pollers of one engine.

    Each channel has a topic; a nudge with topics wakes only the channels of those topics
    (a started run concerns the scheduler, not the activity worker), one without wakes all.
    """

    def __init__(self) -> None:
        self._events: list[tuple[str, threading.Event]] = []

    def channel(self, topic: str = "") -> threading.Event:
        event = threading.Event()
        self._events.append((topic, event))
        return event

    def __call__(self, *topics: str) -> None:
        for topic, event in self._events:
            if not topics or topic in topics:
                event.set()


class Foreground:
    """The application's calls into a started engine come first: while one waits for the store,
    the workflow worker steps aside between its tasks.

    A call such as ``start_workflow`` releases the GIL while it waits for PostgreSQL, and must
    take it back when the answer comes. The workflow worker runs its tasks in pure Python for
    milliseconds at a time; CPython lets a waiting thread in only after a switch interval of
    5 ms, so under load a start waited for the GIL longer than for the database, and the
    application's loop ran at a fraction of its speed. So a call in flight is counted here,
    and the worker, after each task, sleeps ``pause`` seconds if one is: the GIL is free when
    the answer arrives. A yield without sleeping (``sleep(0)``) does not do it: the yielding
    thread takes the GIL straight back before the waiting one has woken. The pause is short
    (50 µs).
    """

    def __init__(self, pause: float = 0.00005) -> None:
        self.pause = pause
        self._calls = 0
        # the application's threads count their calls in and out concurrently (``+=`` is not
        # atomic); the worker only reads the count, without it
        self._lock = threading.Lock()

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Around an application's call that waits for the store."""
        with self._lock:
            self._calls += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1

    def busy(self) -> bool:
        return self._calls > 0

    def step_aside(self) -> bool:
        """Pause a moment if an application's call is waiting for the store; whether it did."""
        if self._calls <= 0 or self.pause <= 0:
            return False
        time.sleep(self.pause)
        return True


class PollingThread:
    """Calls ``step`` until stopped; after each round, sleeps as long as the round said.

    A round returns how many seconds its thread may idle (0: straight back). The sleep is
    ``wait(seconds)``, which a wake-up call ends early (a ``threading.Event``'s ``wait``, then
    ``clear``; a flusher waits on the buffer's condition instead).

    No exception ends the loop — not the store's, not a bug's, not a ``BaseException`` that
    user code let through: it is logged with the thread's name, the loop backs off and goes on.
    ``retire()`` ends the loop after its current step (the watchdog replaces a thread blocked in
    workflow code by a fresh one, and the blocked one leaves when the code returns).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], float],
        wait: Callable[[float], object],
        clear: Callable[[], None] | None,
        stopping: threading.Event,
        *,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
    ) -> None:
        self.name = name
        self._step, self._wait, self._clear, self._stopping = step, wait, clear, stopping
        self._backoff, self._max_backoff = backoff, max_backoff
        self._retired = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    @property
    def retired(self) -> bool:
        return self._retired.is_set()

    def retire(self) -> None:
        """Leave the loop after the current step (a fresh thread takes over this one's work)."""
        self._retired.set()

    def fresh(self) -> PollingThread:
        """A new, unstarted thread running the same step (to replace this one)."""
        return PollingThread(
            self.name,
            self._step,
            self._wait,
            self._clear,
            self._stopping,
            backoff=self._backoff,
            max_backoff=self._max_backoff,
        )

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            # the thread ends (logged here; the watchdog replaces it and counts it)
            if not self._retired.is_set():
                log.critical("%s died", self.name, exc_info=True)

    def _loop(self) -> None:
        failures = 0
        while not self._stopping.is_set() and not self._retired.is_set():
            try:
                idle = self._step()
                failures = 0
            except BaseException as exc:
                if self._retired.is_set():
                    return  # replaced, and interrupted while blocked: nothing of this thread's is wanted
                # the store is unreachable or refused, or a bug: back off, then try again
                failures += 1
                # the whole traceback once per outage; one line for each further failure
                log.warning(
                    "%s failed (%d in a row: %s); backing off",
                    self.name,
                    failures,
                    _name_of(exc),
                    exc_info=failures == 1 or not isinstance(exc, Exception),
                )
                self._stopping.wait(min(self._backoff * 2**failures, self._max_backoff))
                continue
            if idle > 0:
                self._wait(idle)
                if self._clear is not None:
                    self._clear()


def _name_of(exc: BaseException) -> str:
    try:
        return type(exc).__name__
    except BaseException:  # noqa: BLE001 - a hostile type: its name is not worth dying for
        return "an exception"


ACTIVITY_THREADS = "dex-activity"  # the pool's threads are named dex-activity_0, dex-activity_1, ...


class AttemptPool(Protocol):
    """Where the engine hands activity attempts (:class:`ActivityPool`; a simulated node's
    pool in :mod:`dex.simulation.pool`)."""

    def call(self, fn: Callable[[T], object], arg: T, then: Callable[[], object]) -> None:
        """Call ``fn(arg)`` and then ``then()``, whatever ``fn`` did; ``then()`` alone for a call
        a cancelling ``shutdown`` drops. ``RuntimeError`` once the pool is shut down."""
        ...

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None: ...


# a call, its arguments, and either the future that carries its outcome or the callback that
# follows it (``ActivityPool.call``)
_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "Future[Any] | None", Callable[[], object] | None]


class ActivityPool(Executor):
    """The threads that run activity attempts: ``submit`` and ``shutdown`` as a
    ``ThreadPoolExecutor``'s, on daemon threads that the interpreter does not join at exit.

    ``concurrent.futures`` joins its pools' threads when the interpreter exits (daemon or not),
    so a program that stopped its engine with ``stop(timeout)`` and returned would hang until
    the attempts the stop abandoned ended, however long they run (docs/reference/contract.md §8: they are abandoned to
    their leases). These threads are left behind instead: the process exits, and the abandoned
    attempts' leases lapse and another worker runs them again.

    Like a ``ThreadPoolExecutor``, the pool starts a thread per submitted call while none is
    idle, up to ``max_workers``.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = ACTIVITY_THREADS) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._size = max_workers
        self._prefix = thread_name_prefix
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread that waits for a job
        self._workers: list[threading.Thread] = []
        self._closed = False
        # submitting (coordinator, awaited attempts) and shutdown (stop) race: a job put after
        # shutdown's sentinel would never run, and its callback never be called
        self._guard = threading.Lock()
        # a pool dropped without shutdown() lets its threads go (they hold no reference to it)
        weakref.finalize(self, self._jobs.put, None)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[T] = Future()
            self._put((fn, args, kwargs, future, None))
            return future

    def call(self, fn: Callable[[T], object], arg: T, then: Callable[[], object]) -> None:
        """Call ``fn(arg)`` on a pool thread, then ``then()`` there, whatever ``fn`` did: a
        ``submit`` without the future (and its condition and locks) that no caller reads. What
        either raises is logged; ``RuntimeError`` once the pool is shut down, as ``submit``."""
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._put((fn, (arg,), {}, None, then))

    def _put(self, job: _Job) -> None:  # under the guard
        self._jobs.put(job)
        if not self._idle.acquire(blocking=False) and len(self._workers) < self._size:
            thread = threading.Thread(
                target=_work,
                args=(self._jobs, self._idle),
                name=f"{self._prefix}_{len(self._workers)}",
                daemon=True,
            )
            thread.start()
            self._workers.append(thread)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As an executor's; with ``cancel_futures``, the calls not started are dropped: their
        futures cancelled, and the callbacks of ``call``'s calls called (outside the pool's lock,
        since one may hand the pool more work, which it then refuses)."""
        cancelled: list[_Job] = []
        with self._guard:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        cancelled.append(job)
            self._jobs.put(None)  # each thread passes it on to the next and leaves
            workers = list(self._workers)
        for _fn, _args, _kwargs, future, then in cancelled:
            if future is not None:
                future.cancel()  # its callbacks run
            elif then is not None:
                _logged(then, "the callback after a call in the activity pool raised")  # the call never ran
        if wait:
            for thread in workers:
                thread.join()


def _work(jobs: queue.SimpleQueue[_Job | None], idle: threading.Semaphore) -> None:
    """An activity thread's loop: run jobs until the pool is shut down (or dropped)."""
    while True:
        job = jobs.get()
        if job is None:
            jobs.put(None)  # for the next thread
            return
        fn, args, kwargs, future, then = job
        del job
        if future is None:
            _call_then(fn, args, then)
        elif future.set_running_or_notify_cancel():
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - the future carries it, as ThreadPoolExecutor's do
                future.set_exception(exc)
                del exc
            else:
                future.set_result(result)
                del result
        del future, fn, args, kwargs, then
        idle.release()


def _call_then(fn: Callable[..., Any], args: tuple[Any, ...], then: Callable[[], object] | None) -> None:
    """A job of ``ActivityPool.call``: nothing either call raises ends the pool's thread."""
    _logged(lambda: fn(*args), "a call in the activity pool raised (its outcome is left to its lease)")
    if then is not None:
        _logged(then, "the callback after a call in the activity pool raised")


def _logged(call: Callable[[], object], failed: str) -> None:
    """Call ``call``; what it raises, a ``BaseException`` included, is logged as ``failed``."""
    try:
        call()
    except BaseException:
        log.exception("%s", failed)


def activity_pool(concurrency: int) -> ActivityPool:
    return ActivityPool(concurrency, thread_name_prefix=ACTIVITY_THREADS)
