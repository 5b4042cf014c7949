"""The activity pool of a simulated node: attempts wait until the simulator runs one.

A started engine hands each claimed attempt to its pool of threads (the coordinator's
``RunAttempt`` command); a simulated node hands it to this pool instead, where it waits, as an
attempt queued behind busy threads does, until the simulator picks it to run (to its end, in
one step) or to hang (never to end). Its future completes as a thread pool's would, so the
callback the engine hands with it (``call``'s ``then``: the coordinator's ``AttemptEnded``)
runs as in production.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import attrs

from dex.app.ports.store import ActivityTask

T = TypeVar("T")


@attrs.define
class Job:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]

    @property
    def task(self) -> ActivityTask | None:
        """The attempt's task (the engine submits ``activity_worker.run(task)``)."""
        first = self.args[0] if self.args else None
        return first if isinstance(first, ActivityTask) else None


class SimulatedPool(Executor):
    """An ``Executor`` whose jobs run only when :meth:`run` is called (module docstring)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.hung: list[Job] = []  # never to end: their slots stay taken, their leases lapse
        self._closed = False

    def __len__(self) -> int:
        return len(self.jobs)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if kwargs:
            raise TypeError("the simulated pool runs positional calls only")
        future: Future[T] = Future()
        self.jobs.append(Job(future, fn, args))
        return future

    def call(self, fn: Callable[[T], object], arg: T, then: Callable[[], object]) -> None:
        """The engine's hand-over of an attempt (``runner.AttemptPool``): ``then`` follows the
        job's end, its cancellation by a stop, or never (a hung job)."""
        self.submit(fn, arg).add_done_callback(lambda _future: then())

    def run(self, index: int) -> ActivityTask | None:
        """Run the ``index``-th waiting job to its end; its task."""
        job = self.jobs.pop(index)
        if job.future.set_running_or_notify_cancel():
            try:
                job.future.set_result(job.fn(*job.args))
            except BaseException as exc:  # noqa: BLE001 - the future carries it, as a thread pool's does
                job.future.set_exception(exc)
        return job.task

    def hang(self, index: int) -> ActivityTask | None:
        """The ``index``-th waiting job starts and never ends."""
        job = self.jobs.pop(index)
        job.future.set_running_or_notify_cancel()
        self.hung.append(job)
        return job.task

    def run_all(self) -> int:
        """Run every waiting job, in order; how many ran."""
        count = 0
        while self.jobs:
            self.run(0)
            count += 1
        return count

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        if cancel_futures:
            jobs, self.jobs = self.jobs, []
            for job in jobs:
                job.future.cancel()
