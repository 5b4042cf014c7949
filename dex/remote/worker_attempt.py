"""One claimed task of a :class:`dex.remote.worker.Worker`, run to its end: the function called,
its lease kept by heartbeats, its cancellation told, its result or failure reported.

The attempt runs in a thread of its own (an ``async def`` function on an event loop of that
thread). Beside it a heartbeat thread renews the lease every third of ``heartbeat_timeout`` (at
most every ``max_heartbeat_interval`` seconds, so a cancellation is learnt soon) until the
outcome is reported. A heartbeat answered ``cancel_requested``, or 409 (the lease is lost),
marks the attempt cancelled: ``dex.activity_context().cancel_requested`` turns True, an
``async def`` function is cancelled at its next ``await``, and nothing it returns is reported
(the server would refuse it). Faults are the attempt's own: an exception of any kind from the
function becomes its failure; a report the server did not take for want of an answer (no
connection, 5xx, 503) is sent again after a growing pause while the lease may still be held.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import attrs

from dex.app.definitions.activity_context import ActivityContext, reset_activity_context, set_activity_context
from dex.domain.values import ApplicationError, FailureInfo
from dex.remote.worker_client import ActivityTaskClient, Backoff, WorkerCallError, encode_value

log = logging.getLogger("dex.remote.worker")


class BadTaskError(ValueError):
    """A poll answered a task without the fields the API promises (another server, a proxy)."""


@attrs.frozen(kw_only=True)
class ClaimedTask:
    """A task as the poll handed it out: what to run, and the lease to name when reporting."""

    task_id: int
    run_id: str
    name: str
    attempt: int
    args: tuple[Any, ...]
    lease_version: int
    heartbeat_timeout: float  # seconds: the lease lapses this long after the claim or a heartbeat

    @classmethod
    def from_json(cls, value: object) -> ClaimedTask:
        """The task of one entry of a poll's answer; :class:`BadTaskError` when it is not one."""
        if not isinstance(value, dict):
            raise BadTaskError(f"a polled task must be an object, got {type(value).__name__}")
        try:
            task = cls(
                task_id=value["task_id"],
                run_id=value["run_id"],
                name=value["name"],
                attempt=value["attempt"],
                args=tuple(value["args"]),
                lease_version=value["lease_version"],
                heartbeat_timeout=float(value["heartbeat_timeout"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadTaskError(f"a polled task lacks a field or has a bad one: {exc!r}") from None
        if not isinstance(task.task_id, int) or not isinstance(task.lease_version, int) or task.heartbeat_timeout <= 0:
            raise BadTaskError("a polled task's task_id, lease_version or heartbeat_timeout is not usable")
        return task


class RemoteAttempt:
    """Runs ``function`` for ``task`` and reports its outcome through ``client``; :meth:`run`
    answers how it ended: ``completed``, ``failed``, ``cancelled``, ``lost`` (409: another worker
    has the task, or the run ended) or ``abandoned`` (no report got through before the lease
    lapsed: the task comes back as its next attempt)."""

    def __init__(
        self,
        client: ActivityTaskClient,
        task: ClaimedTask,
        function: Callable[..., Any],
        worker_id: str,
        *,
        max_heartbeat_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._task = task
        self._function = function
        self._worker_id = worker_id
        self._every = min(task.heartbeat_timeout / 3, max_heartbeat_interval)
        self._clock = clock
        self._renewed_at = clock()  # the lease runs heartbeat_timeout from the claim, then from each renewal
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()  # guards _cancel_async: set on the attempt's loop, called by heartbeats
        self._cancel_async: Callable[[], object] | None = None

    def run(self) -> str:
        """Run the attempt to its reported end, heartbeating meanwhile. Never raises."""
        beats = threading.Thread(target=self._heartbeats, name=f"dex-heartbeat-{self._task.task_id}", daemon=True)
        beats.start()
        try:
            return self._run()
        except BaseException as exc:  # noqa: BLE001 - a fault of the worker's own: the lease lapses, the task returns
            log.error("task %s: the worker failed while reporting it: %r", self._task.task_id, exc)
            return "abandoned"
        finally:
            self._done.set()
            beats.join()

    def _run(self) -> str:
        value, failure, retry_after = self._call()
        if self._cancelled.is_set():
            return "cancelled"  # the run is over or the lease is gone: a report would be refused
        if failure is not None:
            return self._report_failure(failure, retry_after)
        try:
            result = encode_value(value)
        except Exception as exc:  # noqa: BLE001 - no JSON form (or a hostile value): as a Python activity's result
            message = f"the result has no JSON form: {_text(exc)}"
            return self._report_failure(FailureInfo(type="SerializationError", message=message, terminal=True), None)
        try:
            outcome = self._send(
                lambda: self._client.complete(self._task.task_id, self._task.lease_version, self._worker_id, result)
            )
        except WorkerCallError as exc:
            if exc.status not in (413, 422):
                raise
            # dex refused the value (too large, not storable): retrying would return the same
            return self._report_failure(FailureInfo(type=exc.kind, message=exc.message, terminal=True), None)
        return outcome or "completed"

    def _call(self) -> tuple[Any, FailureInfo | None, float | None]:
        """The function's value, or the failure it raised (and its ``retry_after``, in seconds),
        under the activity's context."""
        task = self._task
        try:
            inspect.signature(self._function).bind(*task.args)
        except TypeError as exc:  # arguments it cannot take will not fit better next time
            mismatch = TypeError(f"activity {task.name!r} takes other arguments: {_text(exc)}")
            return None, FailureInfo.from_exception(mismatch, terminal=True), None
        except ValueError:
            pass  # a builtin without a signature: the call itself tells
        context = ActivityContext(
            run_id=task.run_id,
            activity_name=task.name,
            attempt=task.attempt,
            heartbeat_fn=self._beat,
            cancelled_fn=self._cancelled.is_set,
        )
        token = set_activity_context(context)
        try:
            value = self._function(*task.args)
            if inspect.isawaitable(value):  # an async def, or anything else that returned one
                value = asyncio.run(self._awaited(value))
            return value, None, None
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... of user code are failures too
            return None, FailureInfo.from_exception(exc), _retry_after(exc)
        finally:
            reset_activity_context(token)

    async def _awaited(self, awaitable: Awaitable[Any]) -> Any:
        running = asyncio.ensure_future(awaitable)
        loop = asyncio.get_running_loop()
        with self._lock:
            self._cancel_async = lambda: loop.call_soon_threadsafe(running.cancel)
        if self._cancelled.is_set():
            running.cancel()
        try:
            return await running
        finally:
            with self._lock:
                self._cancel_async = None

    def _cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            if self._cancel_async is not None:
                self._cancel_async()

    def _heartbeats(self) -> None:
        while not self._done.wait(self._every):
            self._beat()

    def _beat(self) -> bool:
        """One heartbeat; False once the attempt should stop (``ActivityContext.heartbeat``)."""
        try:
            cancel = self._client.heartbeat(self._task.task_id, self._task.lease_version, self._worker_id)
        except WorkerCallError as exc:
            if exc.lease_lost:
                self._cancel()
            else:  # no answer or a server fault: the next heartbeat tries again, the lease may hold
                log.warning("task %s: heartbeat failed: %s", self._task.task_id, exc)
            return not self._cancelled.is_set()
        self._renewed_at = self._clock()
        if cancel:
            self._cancel()
        return not self._cancelled.is_set()

    def _report_failure(self, failure: FailureInfo, retry_after: float | None) -> str:
        def send() -> None:
            self._client.fail(
                self._task.task_id,
                self._task.lease_version,
                self._worker_id,
                kind=failure.type,
                message=failure.message,
                terminal=failure.terminal,
                retry_after_seconds=retry_after,
            )

        return self._send(send) or "failed"

    def _send(self, call: Callable[[], None]) -> str | None:
        """Make ``call`` until the server takes it; None when it did, else why it was given up.
        A refusal other than 409 and the transient ones is raised."""
        backoff = Backoff()
        while True:
            try:
                call()
                return None
            except WorkerCallError as exc:
                if exc.lease_lost:
                    return "lost"
                if not exc.transient:
                    raise
                if self._cancelled.is_set():
                    return "cancelled"
                if self._clock() > self._renewed_at + self._task.heartbeat_timeout:
                    log.warning(
                        "task %s: its report did not get through before its lease lapsed: %s", self._task.task_id, exc
                    )
                    return "abandoned"
                pause = backoff.next_pause(exc.retry_after)
                log.warning("task %s: report failed (%s); again in %.1f s", self._task.task_id, exc, pause)
                time.sleep(pause)  # the heartbeat thread keeps the lease meanwhile


def _retry_after(exc: BaseException) -> float | None:
    """An ``ApplicationError``'s ``retry_after`` in seconds, if it has a usable one."""
    try:
        delay = getattr(exc, "retry_after", None) if isinstance(exc, ApplicationError) else None
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
            return seconds if seconds >= 0 else None
    except BaseException:  # noqa: BLE001 - a hostile property: the policy's delay applies
        return None
    return None


def _text(exc: BaseException) -> str:
    return FailureInfo.from_exception(exc).message
