"""A worker for activities in another Python process or codebase, over the remote-worker API
(docs/reference/contract.md §13, §16): the standard library and ``dex`` itself, no ``[web]`` extra.

::

    from dex.remote.worker import Worker

    worker = Worker("http://127.0.0.1:8765", token=None, concurrency=8, worker_id=None)

    @worker.activity("resize-image")          # sync or async def; raise dex.ApplicationError /
    def resize(url: str, width: int) -> str:  # dex.TerminalError as in Python activities
        ...

    worker.run()   # blocks; SIGTERM or SIGINT: stop polling, finish in-flight tasks, exit 0

:meth:`Worker.run` long-polls for the registered names, never holding more than
``concurrency`` tasks: each poll asks for as many as there are free places. Each task runs in a
thread of its own (:class:`~dex.remote.worker_attempt.RemoteAttempt`), heartbeating, and
reports its result or failure. A poll that fails (no answer, 5xx, 503, a refusal) is tried
again after a growing pause (0.5 s doubling to 30 s, or the server's ``Retry-After``), never at
once. A signal (or :meth:`Worker.stop`) stops the polling: the poll in flight returns, what it
claimed runs, and :meth:`run` returns once every task is reported.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from dex.remote.worker_attempt import BadTaskError, ClaimedTask, RemoteAttempt
from dex.remote.worker_client import ActivityTaskClient, Backoff, WorkerCallError

log = logging.getLogger("dex.remote.worker")

F = TypeVar("F", bound=Callable[..., Any])

_MAX_TEXT = 1000  # characters in an activity name or a worker id, as the server takes them
_MAX_NAMES = 100  # activity names one poll may name
_MAX_CLAIM = 100  # tasks one poll may claim
_MAX_WAIT_SECONDS = 60.0
_STOP_CHECK = 0.1  # seconds: how soon a waiting loop notices stop() or a signal


class Worker:
    """Runs the activities registered with :meth:`activity` for the dex server at ``url``.

    ``token`` is the server's bearer token (``dex web --token``); ``concurrency`` the most tasks
    run at once; ``worker_id`` names this worker in leases (``python-HOST-PID`` by default).
    ``poll_wait_seconds`` is how long one poll waits for work (a stop waits for it to return);
    ``max_heartbeat_interval`` the longest pause between a task's heartbeats (they come every
    third of the task's ``heartbeat_timeout``, or sooner), which bounds how late a cancellation
    is learnt. A bad value raises ``ValueError`` or ``TypeError`` here.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        concurrency: int = 8,
        worker_id: str | None = None,
        *,
        poll_wait_seconds: float = 10.0,
        max_heartbeat_interval: float = 2.0,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or _unsendable(url):
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
        if token is not None and (not isinstance(token, str) or not token or not _header_safe(token)):
            raise ValueError("token must be a non-empty string of printable ASCII without spaces")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        if not _seconds(poll_wait_seconds) or poll_wait_seconds > _MAX_WAIT_SECONDS:
            raise ValueError(
                f"poll_wait_seconds must be between 0 and {_MAX_WAIT_SECONDS:g}, got {poll_wait_seconds!r}"
            )
        if not _seconds(max_heartbeat_interval) or max_heartbeat_interval <= 0:
            raise ValueError(
                f"max_heartbeat_interval must be a positive number of seconds, got {max_heartbeat_interval!r}"
            )
        self.worker_id = _checked_text(
            worker_id if worker_id is not None else f"python-{socket.gethostname()}-{os.getpid()}", "worker_id"
        )
        self.concurrency = concurrency
        self._client = ActivityTaskClient(url, token)
        self._poll_wait = poll_wait_seconds
        self._max_heartbeat_interval = max_heartbeat_interval
        self._functions: dict[str, Callable[..., Any]] = {}
        self._stop_requested = False  # set by stop() or a signal handler: a plain flag, no lock to take
        self._running = threading.Lock()  # held by run(): one loop per worker
        self._attempts: set[threading.Thread] = set()  # what is in flight; changed by the loop only
        self._slot_freed = threading.Event()

    def activity(self, name: str) -> Callable[[F], F]:
        """Register the decorated function (``def`` or ``async def``) as the activity ``name``.

        It is called with the workflow's arguments as JSON values (dicts, lists, strings,
        numbers, booleans, None) and returns a JSON value. Raise :class:`dex.ApplicationError`
        (``terminal``, ``retry_after``) or :class:`dex.TerminalError` to steer the retries, as in
        Python activities; any other exception is retried under the activity's policy.
        ``dex.activity_context()`` works inside it: ``cancel_requested`` turns True once the run
        was cancelled or ended or the lease was lost, and an ``async def`` function is then
        cancelled at its next ``await``. Nothing it returns afterwards is reported.
        """
        _checked_text(name, "the activity name")
        if name in self._functions:
            raise ValueError(f"activity {name!r} is registered already")
        if len(self._functions) >= _MAX_NAMES:
            raise ValueError(f"a worker runs at most {_MAX_NAMES} activity names")

        def register(function: F) -> F:
            if not callable(function):
                raise TypeError(f"@worker.activity({name!r}) decorates a function, got {type(function).__name__}")
            if name in self._functions:  # two decorators of one name made before either was applied
                raise ValueError(f"activity {name!r} is registered already")
            self._functions[name] = function
            return function

        return register

    def stop(self) -> None:
        """Stop polling; :meth:`run` returns once the tasks in flight are reported. Safe from any
        thread and from a signal handler."""
        self._stop_requested = True

    def run(self) -> None:
        """Poll and run tasks until :meth:`stop`, SIGTERM or SIGINT; then finish the tasks in
        flight and return (so a script ending with ``worker.run()`` exits 0). The signal handlers
        are installed only when called from the main thread, and put back on return."""
        if not self._functions:
            raise RuntimeError("no activity is registered: decorate a function with @worker.activity(name)")
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this worker is running already")
        restore = self._handle_signals()
        try:
            self._stop_requested = False
            log.info("worker %s polling for %s", self.worker_id, ", ".join(self._functions))
            self._poll_until_stopped()
        finally:
            self._drain()
            restore()
            self._running.release()

    def _poll_until_stopped(self) -> None:
        backoff = Backoff()
        names = list(self._functions)
        while not self._stop_requested:
            free = self._free_places()
            if free == 0:
                self._slot_freed.wait(_STOP_CHECK)
                self._slot_freed.clear()
                continue
            try:
                claimed = self._client.poll(self.worker_id, names, min(free, _MAX_CLAIM), self._poll_wait)
            except WorkerCallError as exc:
                pause = backoff.next_pause(exc.retry_after)
                log.warning("poll failed (%s); polling again in %.1f s", exc, pause)
                self._pause(pause)
                continue
            backoff.reset()
            for entry in claimed:
                self._start(entry)

    def _start(self, entry: object) -> None:
        try:
            task = ClaimedTask.from_json(entry)
        except BadTaskError as exc:  # nothing to report it under: its lease lapses
            log.error("the poll answered a task that cannot be run: %s", exc)
            return
        function = self._functions.get(task.name)
        if function is None:  # the server handed out a name we did not ask for
            log.error("task %s names activity %r, which this worker does not run", task.task_id, task.name)
            return
        attempt = RemoteAttempt(
            self._client, task, function, self.worker_id, max_heartbeat_interval=self._max_heartbeat_interval
        )
        thread = threading.Thread(
            target=self._run_attempt, args=(task, attempt), name=f"dex-task-{task.task_id}", daemon=True
        )
        self._attempts.add(thread)
        thread.start()

    def _run_attempt(self, task: ClaimedTask, attempt: RemoteAttempt) -> None:
        try:
            outcome = attempt.run()
            log.info("task %s %s attempt %s: %s", task.task_id, task.name, task.attempt, outcome)
        finally:
            self._slot_freed.set()

    def _free_places(self) -> int:
        self._attempts = {thread for thread in self._attempts if thread.is_alive()}
        return self.concurrency - len(self._attempts)

    def _pause(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < until:
            time.sleep(min(_STOP_CHECK, max(0.0, until - time.monotonic())))

    def _drain(self) -> None:
        """Wait for every task in flight to be reported."""
        if self._attempts:
            log.info("worker %s stopping: finishing %d tasks", self.worker_id, len(self._attempts))
        while self._free_places() < self.concurrency:
            for thread in list(self._attempts):
                thread.join(_STOP_CHECK)

    def _handle_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def stop(signum: int, frame: FrameType | None) -> None:
            self.stop()  # only a flag: a handler must take no lock the interrupted code may hold

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def _checked_text(value: object, what: str) -> str:
    """``value`` if the server takes it as a name: a non-empty string without NUL or lone surrogates."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > _MAX_TEXT:
        raise ValueError(f"{what} must hold 1 to {_MAX_TEXT} characters")
    if "\x00" in value or _unsendable(value):
        raise ValueError(f"{what} must not hold a NUL or a lone surrogate: {value!r}")
    return value


def _unsendable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in text


def _header_safe(token: str) -> bool:
    return token.isascii() and token.isprintable() and " " not in token


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
