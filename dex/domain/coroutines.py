"""Deterministic stepping of workflow coroutines, without an asyncio event loop.

Workflow code awaits only :class:`DexFuture` objects. A :class:`CoroutineStepper` sends into
each coroutine until it yields a future that is not done, and resumes it from a FIFO ready
queue when that future completes. Which coroutine runs next depends only on the order in
which futures complete, which replay reproduces from history, so every run of the same
history takes the same path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from dex.domain.errors import CancelledError

T = TypeVar("T")

CLOSE_THROWS = 3
"""How many times closing throws ``GeneratorExit`` into a coroutine that awaits again before
it abandons it (one is what ``coroutine.close()`` does; a few more let code that awaits once
in a ``finally`` block, on a step that cannot complete, still unwind)."""

_FOREIGN_AWAIT_HINT = (
    "workflow code may await only what WorkflowContext returns "
    "(ctx.activity, ctx.sleep, ctx.wait_for_event, ctx.child, ctx.gather); "
    "use ctx.gather instead of asyncio.gather, asyncio.wait or asyncio.create_task, "
    "ctx.sleep instead of asyncio.sleep, ctx.wait_for_event(..., timeout=...) instead of asyncio.wait_for, "
    "and run I/O in an activity"
)
# what asyncio says when workflow code calls it without a loop (asyncio.create_task and
# wait_for ask for the running loop; gather and ensure_future, outside the main thread, for
# the current one)
_MISSING_LOOP = ("no running event loop", "no current event loop")


class DexFuture(Generic[T]):
    """The awaitable that every WorkflowContext step returns."""

    __slots__ = ("_callbacks", "_done", "_exception", "_value", "canceller", "label")

    def __init__(self, label: str = "") -> None:
        self._done = False
        self._value: Any = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[DexFuture[T]], None]] = []
        self.label = label
        # what cancelling the step means outside this future (an activity dropped, a child
        # cancelled), set by whoever made the future; it returns False where it may not cancel
        self.canceller: Callable[[], bool] | None = None

    def cancel(self) -> bool:
        """Cancel the step (docs/reference/contract.md §14): awaiting it then raises
        ``dex.CancelledError``. False, and nothing changes, if it is done already."""
        if self._done:
            return False
        if self.canceller is not None and not self.canceller():
            return False
        self.set_exception(CancelledError(f"{self.label or 'step'} was cancelled"))
        return True

    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        if not self._done:
            raise RuntimeError(f"{self.label or 'future'} is not done yet")
        if self._exception is not None:
            raise self._exception
        return self._value  # type: ignore[no-any-return]

    def exception(self) -> BaseException | None:
        return self._exception

    def set_result(self, value: T) -> None:
        self._finish(value, None)

    def set_exception(self, exception: BaseException) -> None:
        self._finish(None, exception)

    def _finish(self, value: Any, exception: BaseException | None) -> None:
        if self._done:
            return
        self._done, self._value, self._exception = True, value, exception
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[DexFuture[T]], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def __await__(self) -> Generator[Any, None, T]:
        if not self._done:
            yield self
        return self.result()

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<DexFuture {self.label} {state}>"


def never(label: str = "") -> DexFuture[T]:
    """A future that never completes: what a step returns to code that may issue nothing (its
    executor closed or given up); awaited, the code stops there, and yields to its closer."""
    return DexFuture(label)


def resolved(value: T, label: str = "") -> DexFuture[T]:
    """A future that is already done with ``value``."""
    future: DexFuture[T] = DexFuture(label)
    future.set_result(value)
    return future


class _Task:
    __slots__ = ("coro", "future", "throw", "waiting", "woken_by")

    def __init__(self, coro: Coroutine[Any, Any, Any], label: str) -> None:
        self.coro = coro
        self.future: DexFuture[Any] = DexFuture(label)
        self.throw: BaseException | None = None
        self.waiting: DexFuture[Any] | None = None  # the future it awaits, until that wakes it
        self.woken_by: DexFuture[Any] | None = None  # the future that woke it, until it resumes


class CoroutineStepper:
    """Runs workflow coroutines until every one of them waits on a pending future."""

    def __init__(self) -> None:
        self._ready: deque[_Task] = deque()
        self._tasks: list[_Task] = []
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], label: str = "") -> DexFuture[T]:
        """Schedule ``coro``; the returned future completes with its result or exception (never,
        once the stepper is closed: the coroutine is then closed unstarted)."""
        if self._closed:
            coro.close()  # never started: closing it runs none of its code
            return never(label)
        task = _Task(coro, label)
        self._tasks.append(task)
        self._ready.append(task)
        return task.future

    def run_until_blocked(self) -> None:
        """Step ready coroutines (FIFO) until none can make progress."""
        while self._ready:
            self._step(self._ready.popleft())

    def _step(self, task: _Task) -> None:
        task.woken_by = None
        try:
            if task.throw is not None:
                exc, task.throw = task.throw, None
                yielded = task.coro.throw(exc)
            else:
                yielded = task.coro.send(None)
        except StopIteration as stop:
            task.future.set_result(stop.value)
            return
        except BaseException as exc:  # noqa: BLE001 - the workflow's own failure, reported through its future
            task.future.set_exception(_explain_missing_loop(exc))
            return
        if isinstance(yielded, DexFuture):
            task.waiting = yielded
            yielded.add_done_callback(lambda done: self._wake(task, done))
        else:
            task.throw = TypeError(f"workflow awaited {_shown(yielded)}: {_FOREIGN_AWAIT_HINT}")
            self._ready.append(task)

    def _wake(self, task: _Task, done: DexFuture[Any]) -> None:
        if task.waiting is done:  # not a future it was pulled away from by throw()
            task.waiting, task.woken_by = None, done
            self._ready.append(task)

    def _task_of(self, future: DexFuture[Any]) -> _Task | None:
        return next((task for task in self._tasks if task.future is future), None)

    def waiting_on(self, future: DexFuture[Any]) -> DexFuture[Any] | None:
        """What the coroutine whose result ``future`` is awaits now (None: ready, or not ours)."""
        task = self._task_of(future)
        return None if task is None else task.waiting

    def throw(self, future: DexFuture[Any], exception: BaseException) -> DexFuture[Any] | None:
        """Raise ``exception`` in the coroutine whose result ``future`` is, at the await where it
        stands (at its start if it never ran); the future it awaited no longer wakes it. One that
        is ready to resume with what its await gave gets the exception instead: that future is
        returned (the caller may give back what it held). Nothing happens if it is done."""
        task = self._task_of(future)
        if task is None or future.done():
            return None
        task.throw = exception
        if task.waiting is not None:
            task.waiting = None
            self._ready.append(task)
            return None
        return task.woken_by  # in the ready queue (or never started): it gets the exception next

    @property
    def ended(self) -> bool:
        """Whether every coroutine it ran has returned or raised: a close then runs no code."""
        # a coroutine of another kind, without cr_frame, is taken to be still running
        return all(getattr(task.coro, "cr_frame", True) is None for task in self._tasks)

    def close(self) -> int:
        """Stop every coroutine at its current await (runs their ``finally`` blocks); returns how
        many refused to stop (awaited again after :data:`CLOSE_THROWS` throws) and were abandoned.
        A closed stepper runs nothing more: a coroutine spawned on it is closed unstarted."""
        self._closed = True
        self._ready.clear()
        # the list is swapped out first: code run by a close may spawn (ctx.gather) onto it
        tasks, self._tasks = self._tasks, []
        return sum(not _close(task.coro) for task in tasks)


def _close(coro: Coroutine[Any, Any, Any]) -> bool:
    """Close ``coro``: False when it still awaits after :data:`CLOSE_THROWS` throws (abandoned)."""
    for _throw in range(CLOSE_THROWS):
        try:
            coro.close()
        except BaseException:  # noqa: BLE001 - code that awaits in `finally` (or raises) cannot stop us
            pass
        if getattr(coro, "cr_frame", None) is None:  # finished: returned, raised or closed
            return True
        if getattr(coro, "cr_running", False):
            return True  # closed from inside its own code: it unwinds when its caller returns
    return False


def _explain_missing_loop(exc: BaseException) -> BaseException:
    # asyncio primitives look for an event loop before they yield anything; their error
    # alone would not tell the author what to do instead.
    if type(exc) is not RuntimeError:  # asyncio raises exactly this; a user's subclass is theirs
        return exc
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - not asyncio's error, then
        return exc
    if any(phrase in text for phrase in _MISSING_LOOP):
        replacement = TypeError(f"workflow used asyncio ({text}): {_FOREIGN_AWAIT_HINT}")
        replacement.__traceback__ = exc.__traceback__
        return replacement
    return exc


def _shown(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not hide what went wrong
        return f"a {type(value).__name__} object"
