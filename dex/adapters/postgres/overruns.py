"""A transaction step's attempt bounded by its ``lock_timeout`` (docs/reference/contract.md §8: "``lock_timeout``
bounds one attempt").

An ordinary activity that runs too long loses its lease, and another worker runs the task
again. A transaction step holds its task's row ``FOR UPDATE`` instead, for as long as its
transaction is open, so no other worker can take the task over: a step stuck on a lock, in a
long query or in its own code would keep its task, its connection and its slot for good. So
each attempt is watched: when it has run for its ``lock_timeout``, its session is ended from
another connection (``pg_terminate_backend``). The server rolls the transaction back and lets
the row go; the attempt fails with a ``TimeoutError`` naming the step and its
``lock_timeout`` (a failed attempt, retried under the step's policy), and the task, its short
lease long expired, is claimed again. A group of first attempts run inside their workflow task
(:mod:`.checkpoints`) is watched for the least ``lock_timeout`` of its steps; its overrun fails
the group in the store, and its steps go on as tasks of their own, each watched.

An attempt whose code does not return even then (a ``time.sleep``, a loop in Python: nothing
stops a thread from outside) no longer holds its step slot: the watch that ended its session
loses the slot (:mod:`.step_slots`), which the next step takes at once, and whatever the
attempt returns later is dropped. It is counted until it returns (``Engine.health()
.lost_step_slots``).

The session ended is always the step's: the attempt keeps its connection until its watch has
stopped (a watch holds its lock while it ends a session, and the attempt takes that lock
before it gives the connection back). One thread of the process (:data:`WATCHER`, started with
the first watch) keeps every watch; a watch stopped in time is forgotten at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta

import psycopg

from dex.app.ports.store import ActivityTask, StepFailed
from dex.domain.task import NewActivityTask

log = logging.getLogger("dex.worker")


class Overrun:
    """The watch of one attempt (a step's, or a group's): ends the session ``pid`` once the
    attempt has run for ``limit``, unless stopped first, then calls ``lost`` (the attempt's
    lease is gone with its session). ``what`` names the attempt in the log and in the error."""

    def __init__(
        self,
        conninfo: str,
        pid: int,
        limit: timedelta,
        what: str,
        run_id: str | None = None,
        lost: Callable[[], None] | None = None,
    ) -> None:
        self._conninfo, self._pid, self._what, self._run_id = conninfo, pid, what, run_id
        self._lost = lost
        self.limit = limit.total_seconds()
        self.deadline = time.monotonic() + self.limit
        self._lock = threading.Lock()
        self._active = True
        self.fired = False

    def fire(self) -> None:
        """End the session, unless the watch was stopped (called by the watcher's thread)."""
        with self._lock:
            if not self._active:
                return
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", [self._pid])
                self.fired = True
                log.warning("%s: its transaction was ended", self._said(), extra={"run_id": self._run_id})
            except Exception:  # the server is out of reach: its own timeouts end the session
                log.warning("could not end the session of an overrunning transaction step", exc_info=True)
                return  # the session, and the task's row lock, may live on: the attempt keeps its slot
            if self._lost is not None:
                self._lost()

    def stop(self) -> None:
        """Stop the watch; once this returns, the session will not be ended by it."""
        WATCHER.remove(self)
        with self._lock:  # waits for a fire under way
            self._active = False

    def _said(self) -> str:
        return f"{self._what} ran past its lock_timeout ({timedelta(seconds=self.limit)})"

    def error(self) -> TimeoutError:
        return TimeoutError(f"{self._said()}; its transaction was ended and rolled back")


class Watcher:
    """One thread for every watch of the process. Watches with the same limit end in the order
    they began, so each limit keeps its watches in that order (a stopped one is removed at
    once: memory stays with the attempts under way)."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start afresh: in a forked child, the parent's watches (their attempts are the
        parent's) and its thread are not this process's, and a lock may have been held at the
        fork."""
        self._wake = threading.Condition()
        self._by_limit: dict[float, OrderedDict[int, Overrun]] = {}
        self._thread: threading.Thread | None = None
        self._until = float("inf")  # the deadline the thread waits for (it needs no wake-up for a later one)

    def add(self, overrun: Overrun) -> None:
        with self._wake:
            self._by_limit.setdefault(overrun.limit, OrderedDict())[id(overrun)] = overrun
            if self._thread is None or not self._thread.is_alive():  # (a forked child starts its own)
                self._thread = threading.Thread(target=self._run, name="dex-step-overruns", daemon=True)
                self._thread.start()
            if overrun.deadline < self._until:
                self._until = overrun.deadline
                self._wake.notify()

    def remove(self, overrun: Overrun) -> None:
        with self._wake:
            watches = self._by_limit.get(overrun.limit)
            if watches is not None:
                watches.pop(id(overrun), None)

    def _run(self) -> None:
        while True:
            due = self._next_due()
            try:
                due.fire()
            except BaseException:  # a bug here must not end the watches of other steps
                log.exception("the watch of a transaction step failed")

    def _next_due(self) -> Overrun:
        with self._wake:
            while True:
                firsts = [next(iter(watches.values())) for watches in self._by_limit.values() if watches]
                if not firsts:
                    self._until = float("inf")
                    self._wake.wait()
                    continue
                first = min(firsts, key=lambda overrun: overrun.deadline)
                wait = first.deadline - time.monotonic()
                if wait <= 0:
                    del self._by_limit[first.limit][id(first)]
                    return first
                self._until = first.deadline  # (a watch stopped meanwhile makes it wake early, harmlessly)
                self._wake.wait(wait)


WATCHER = Watcher()
if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=WATCHER.forget)


def of_task(task: ActivityTask) -> tuple[timedelta, str, str]:
    """What a step run as a task is watched for: its limit, how it is named, its run."""
    return (
        task.lock_timeout,
        f"transaction step {task.name!r} of run {task.run_id}, attempt {task.attempt},",
        task.run_id,
    )


def of_group(steps: Sequence[NewActivityTask]) -> tuple[timedelta, str, None]:
    """What a group of first attempts is watched for: the least of its steps' limits."""
    names = ", ".join(sorted({repr(step.name) for step in steps}))
    return (
        min(step.lock_timeout for step in steps),
        f"a group of {len(steps)} transaction step{'' if len(steps) == 1 else 's'} ({names})",
        None,
    )


@contextmanager
def watched(
    conninfo: str,
    pid: int,
    limit: timedelta,
    what: str,
    run_id: str | None = None,
    lost: Callable[[], None] | None = None,
) -> Iterator[Overrun]:
    """Watch the attempt on session ``pid`` for ``limit``; ``lost`` is called once its session
    was ended (from the watch's thread). Whatever the attempt raised after that becomes a
    :class:`StepFailed` with a ``TimeoutError`` naming ``what``."""
    overrun = Overrun(conninfo, pid, limit, what, run_id, lost)
    WATCHER.add(overrun)
    try:
        yield overrun
    except BaseException:
        overrun.stop()
        if overrun.fired:
            raise StepFailed(overrun.error()) from None
        raise
    overrun.stop()
