"""The leases of the activity attempts an engine runs: short, kept alive, bounded.

An activity task is claimed under a short lease, the shorter of ``Engine(activity_lease=...)``
(30 s by default) and the activity's ``lock_timeout``, not under ``lock_timeout`` itself: so the
tasks of a process that dies (SIGKILL, power loss) are taken over by another within about
the short lease, however long their ``lock_timeout`` (docs/reference/contract.md §8). While an attempt runs, its
engine extends that lease in batches, about three times per lease; ``lock_timeout`` bounds one
attempt instead: counted from its start, or from its last ``heartbeat()``. An attempt still
running at that deadline is failed at once with ``LockTimeoutError`` and retried as its
policy says (Temporal's start-to-close timeout, where the short lease plays its heartbeat
timeout). Its thread cannot be stopped; whatever it returns later is discarded, because the
failure used up its lease.

:class:`ActivityLeases` owns the register of running attempts. Its ``step`` decides and
returns what to do — which leases to extend, which attempts are overdue — and the activity
worker does it through the write buffer (``ActivityWorker.keep_leases``), from the engine's
activity thread. Attempts run inline by a workflow task hold no lease and are not registered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import attrs

from dex.app.ports.store import ActivityTask

# how many times per lease a running attempt's lease is extended: a lease survives a missed
# round (a slow flush, a busy thread) and still has a third of its time left when extended
ROUNDS_PER_LEASE = 3

# how often the runs of the running attempts are read, to tell them of a cancellation (docs/reference/contract.md §13:
# within a second or two; one read of a few rows per second while attempts run)
CHECK_RUNS_EVERY = timedelta(seconds=1)


def validate_activity_lease(lease: object) -> timedelta:
    """Return ``lease`` if it is a positive timedelta, else raise (TypeError, ValueError)."""
    if not isinstance(lease, timedelta):
        raise TypeError(f"activity_lease must be a timedelta, got {lease!r}")
    if lease <= timedelta(0):
        raise ValueError(f"activity_lease must be positive, got {lease!r}")
    return lease


@attrs.define
class _Attempt:
    task: ActivityTask
    deadline: datetime  # its start, or its last heartbeat(), plus its lock_timeout
    cancelled: bool = False  # its run was cancelled or ended, or its lease is lost
    on_cancel: Callable[[], object] | None = None  # stops an async attempt at its next await


@attrs.frozen(kw_only=True)
class LeaseRound:
    """What a step decided: the leases to extend now, and the attempts past their deadline."""

    extend: tuple[ActivityTask, ...] = ()
    overdue: tuple[ActivityTask, ...] = ()
    check: tuple[ActivityTask, ...] = ()  # read their runs: cancelled or ended ones are told so


class ActivityLeases:
    """The register of the activity attempts this engine runs under a lease."""

    def __init__(self, lease: timedelta) -> None:
        self.lease = validate_activity_lease(lease)
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._overdue: set[tuple[int, int]] = set()
        self._next_round: datetime | None = None
        self._next_check: datetime | None = None
        self._lock = threading.Lock()

    def lease_of(self, task: ActivityTask) -> timedelta:
        """The length of ``task``'s lease: the short lease, at most its ``lock_timeout``."""
        return min(self.lease, task.lock_timeout)

    def __len__(self) -> int:
        return len(self._attempts)

    @contextmanager
    def running(self, task: ActivityTask, now: datetime) -> Iterator[None]:
        """Register the attempt of ``task`` while the block runs."""
        key = _key(task)
        with self._lock:
            self._attempts[key] = _Attempt(task, now + task.lock_timeout)
            # an attempt whose lease is shorter than the others' brings the next round forward
            first_extension = now + self.lease_of(task) / ROUNDS_PER_LEASE
            if self._next_round is None or first_extension < self._next_round:
                self._next_round = first_extension
        try:
            yield
        finally:
            with self._lock:
                self._attempts.pop(key, None)
                self._overdue.discard(key)

    def heartbeat(self, task: ActivityTask, now: datetime) -> bool:
        """The attempt said it is alive: its deadline moves to ``now`` + ``lock_timeout``.
        False if it was failed for running past its deadline (its lease is given up)."""
        key = _key(task)
        with self._lock:
            if key in self._overdue:
                return False
            attempt = self._attempts.get(key)
            if attempt is not None:
                attempt.deadline = now + task.lock_timeout
            return True

    def step(self, now: datetime) -> LeaseRound:
        """Take the attempts past their deadline out of the register; and, once per third of
        the shortest lease among the others, all of those others to extend, in one batch."""
        with self._lock:
            overdue = [key for key, attempt in self._attempts.items() if attempt.deadline <= now]
            late = tuple(self._attempts.pop(key).task for key in overdue)
            self._overdue.update(overdue)
            if not self._attempts:
                self._next_round = None
                return LeaseRound(overdue=late)
            if self._next_round is not None and now < self._next_round:
                return LeaseRound(overdue=late)
            tasks = tuple(attempt.task for attempt in self._attempts.values())
            self._next_round = now + min(self.lease_of(task) for task in tasks) / ROUNDS_PER_LEASE
            return LeaseRound(extend=tasks, overdue=late)

    def due_checks(self, now: datetime) -> tuple[ActivityTask, ...]:
        """The attempts whose runs should be read now (once per :data:`CHECK_RUNS_EVERY`)."""
        with self._lock:
            if self._next_check is not None and now < self._next_check:
                return ()
            self._next_check = now + CHECK_RUNS_EVERY
            return tuple(a.task for a in self._attempts.values() if not a.cancelled)

    def cancel(self, task: ActivityTask) -> bool:
        """Tell the attempt of ``task`` that its run was cancelled or ended, or its lease lost:
        ``cancel_requested`` becomes True and an ``async def`` attempt is cancelled at its next
        await. True the first time (the caller then refuses whatever the attempt returns)."""
        with self._lock:
            attempt = self._attempts.get(_key(task))
            if attempt is None or attempt.cancelled:
                return False
            attempt.cancelled = True
            on_cancel = attempt.on_cancel
        if on_cancel is not None:
            on_cancel()  # outside the lock: it calls into the event loop's thread
        return True

    def cancelled(self, task: ActivityTask) -> bool:
        with self._lock:
            attempt = self._attempts.get(_key(task))
            return attempt is not None and attempt.cancelled

    def on_cancel(self, task: ActivityTask, stop: Callable[[], object]) -> None:
        """Call ``stop`` when the attempt is cancelled (at once if it is already)."""
        with self._lock:
            attempt = self._attempts.get(_key(task))
            if attempt is None:
                return
            attempt.on_cancel = stop
            late = attempt.cancelled
        if late:
            stop()


def _key(task: ActivityTask) -> tuple[int, int]:
    # the lease version too: this engine may claim a task again while a timed-out attempt of
    # an earlier claim still runs
    return (task.task_id, task.lease.version)
