"""What the activity worker keeps of attempts besides their outcomes: how long the recent
ones took (which decides what runs inline, :mod:`dex.app.workflows.inline`, and in groups,
:mod:`dex.app.workflows.step_groups`), failures described without trusting the exception, and how a
failed attempt goes on (:class:`Retries`)."""

from __future__ import annotations

import random
import statistics
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta

from dex.app.machinery.backoff import TASK_RETRY
from dex.app.ports.store import ActivityOutcome, ActivityTask
from dex.app.ports.telemetry import Telemetry
from dex.domain.retry import RetryPolicy
from dex.domain.values import ApplicationError, FailureInfo


class Durations:
    """How long the last few attempts of each activity took (seconds), for inline execution."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            seen = self._seen.get(name)
            if seen is None:
                seen = self._seen[name] = deque(maxlen=self._keep)
            seen.append(seconds)

    def typical(self, name: str) -> float | None:
        """The median of the last attempts of ``name`` (wall time, so an attempt that waited for
        the GIL counts long: the median sees past those); None before its first one ended."""
        with self._lock:
            seen = self._seen.get(name)
            return statistics.median(seen) if seen else None


def lease_expired(task: ActivityTask) -> ActivityOutcome | None:
    """The final failure of a claimed task whose earlier holder lost its lease on the last
    attempt its policy allows (that attempt counts as failed, its outcome unknown); None while
    the policy allows this attempt."""
    if task.attempt <= task.retry_policy.max_attempts:
        return None
    failure = FailureInfo(
        type="LeaseExpiredError",
        message=f"attempt {task.attempt - 1} of activity {task.name!r} lost its lease (its worker died or hung)"
        f" and the retry policy allows {task.retry_policy.max_attempts} attempt(s)",
    )
    return ActivityOutcome(task=task, failure=failure)


def span_attributes(task: ActivityTask) -> dict[str, str | int]:
    """An attempt's tracing attributes."""
    return {"dex.run_id": task.run_id, "dex.activity": task.name, "dex.attempt": task.attempt}


def described_failure(exc: BaseException, *, terminal: bool | None = None) -> FailureInfo:
    """``FailureInfo.from_exception(exc)``, or, if describing ``exc`` raised, :func:`undescribed_failure`."""
    try:
        return FailureInfo.from_exception(exc, terminal=terminal)
    except BaseException:  # noqa: BLE001 - a hostile __str__/__repr__ must not lose the failure
        return undescribed_failure(exc, terminal=bool(terminal))


def undescribed_failure(exc: BaseException, *, terminal: bool = False) -> FailureInfo:
    """A failure for an exception that could not be described (its ``__str__`` or ``__repr__``
    raised, or describing it failed otherwise): its type name only, never ``str(exc)``."""
    try:
        name = type(exc).__name__
        if not isinstance(name, str):
            raise TypeError(name)
    except BaseException:  # noqa: BLE001 - a type whose name cannot be read: still a failure
        name = "BaseException"
    return FailureInfo(type=name, message=f"<{name}: the exception could not be described>", terminal=terminal)


class Retries:
    """How a failed attempt goes on: retried after its policy's next delay, or ended. One
    random source for the jitter of every attempt, shared by the threads that run them."""

    def __init__(self, now: Callable[[], datetime], rng: random.Random, telemetry: Telemetry) -> None:
        self._now, self._rng, self._telemetry = now, rng, telemetry
        self._lock = threading.Lock()

    def failed(self, task: ActivityTask, exc: BaseException) -> ActivityOutcome:
        """The outcome of an attempt whose code raised ``exc`` (any ``BaseException``; one
        whose description raises is a failure all the same)."""
        try:
            failure = FailureInfo.from_exception(exc)
            retry_after = exc.retry_after if isinstance(exc, ApplicationError) else None
        except BaseException:  # noqa: BLE001 - describing it raised (a hostile __str__): a failure all the same
            failure, retry_after = undescribed_failure(exc), None
        return self.retry_or_fail(task, failure, retry_after)

    def retry_or_fail(self, task: ActivityTask, failure: FailureInfo, retry_after: timedelta | None) -> ActivityOutcome:
        """The outcome of a failed attempt: final when terminal or out of attempts, else a retry
        (after ``retry_after`` when the code asked for it)."""
        if failure.terminal:
            return ActivityOutcome(task=task, failure=failure)
        delay = self._next(task.retry_policy, task.attempt)
        if delay is None:
            return ActivityOutcome(task=task, failure=failure)
        return ActivityOutcome(
            task=task, failure=failure, retry_at=self._now() + (delay if retry_after is None else retry_after)
        )

    def timed_out(self, task: ActivityTask) -> ActivityOutcome:
        """The outcome of an attempt that ran past its deadline: a failure, retried as its policy says."""
        failure = FailureInfo(
            type="LockTimeoutError",
            message=f"attempt {task.attempt} of activity {task.name!r} ran longer than its lock_timeout"
            f" ({task.lock_timeout}) since it started or last called heartbeat()",
        )
        delay = self._next(task.retry_policy, task.attempt)
        retry_at = None if delay is None else self._now() + delay
        seconds = task.lock_timeout.total_seconds()
        self._telemetry.task_finished("activity", task.name, "failed" if retry_at is None else "retried", seconds)
        return ActivityOutcome(task=task, failure=failure, retry_at=retry_at)

    def given_back(self, task: ActivityTask) -> ActivityOutcome:
        """A retry of ``task`` as the same attempt (the store failed its transaction step, not
        its code), after ``TASK_RETRY``'s backoff for the claims that did not count."""
        uncounted = max(1, task.lease.version - task.attempt + 1)  # claims of this task less its attempts
        delay = self._next(TASK_RETRY, uncounted) or TASK_RETRY.max_delay
        return ActivityOutcome(task=task, retry_at=self._now() + delay, counts=False)

    def _next(self, policy: RetryPolicy, attempt: int) -> timedelta | None:
        with self._lock:
            return policy.next_delay(attempt, self._rng)
