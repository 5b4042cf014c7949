"""Inline activities: the first attempt of a short activity runs inside the workflow task.

When a workflow task schedules an activity that this engine runs, whose recent attempts here
all took at most a few milliseconds, and whose queue is active with a free slot, the worker runs that
first attempt at once, in its own thread, and applies the outcome as the next block of the
same task (:func:`dex.domain.task.continue_task`); then the next activity, until the workflow
waits for something else, ends, or the task's time budget is spent. The task's one write
records every step, with the history the ordinary path records (one block per step): a
three-step workflow costs one workflow-task write instead of three activity writes and four
workflow-task writes.

What stays the same: activities run at least once (a crash before the write redoes the task,
and its inline attempts); a failed inline attempt that may be retried becomes an ordinary
task with attempt 2, visible when its retry delay has passed; the run's outcome is recorded
once (the task's lease and the (run, sequence) key decide). What differs, and why it is
limited to short activities: an inline attempt holds no lease of its own, so
``heartbeat()`` only reports True, and ``lock_timeout`` does not apply to it; a task taken
over after its lease expired (``lease.version > 1``) runs no activity inline, so an attempt
that outlives the workflow task's lease is not repeated inline forever. An activity's first
attempt in a process always takes the ordinary path: that is how its duration becomes known.

In an answered step (:mod:`dex.app.workflows.answers`) the thread is the ended attempt's own, not the
workflow thread, and the limit is looser: activities that typically take up to
``chained_activity_seconds`` are chained there (see :meth:`InlineActivities.go_on`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

import attrs

from dex.app.activities.worker import ActivityWorker
from dex.app.ports.store import ActivitySlots, ActivityTask, Clock, Lease
from dex.domain import events as ev
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import Continued, NewActivityTask, WorkflowTaskResult

log = logging.getLogger("dex.worker")

# an inline chain stops once its task has this many new events, so that one write stays bounded
_INLINE_EVENTS = 2000

# what an inline attempt gives its task: the run's message, or the task that retries it
Answer = tuple[ev.ActivityTaskCompleted | ev.ActivityTaskFailed | None, NewActivityTask | None]


class QueueView:
    """The activity queues' slots as this engine last read them (``Store.activity_slots``),
    re-read at most every ``ttl`` seconds (and at once after this engine changed a queue), to
    tell whether an activity queue takes work now.

    A queue has room while its tasks hold fewer slots than its capacity, as its scheduler
    counts them: tasks waiting to be scheduled do not count, nor retries waiting out their
    delay. (Counting every task in the queue, as ``QueueInfo.depth`` does, let a hundred
    retries parked behind an outage turn inline attempts off for every other activity of
    their queue, for as long as they waited.)"""

    def __init__(self, read: Callable[[], list[ActivitySlots]], ttl: float = 1.0) -> None:
        self._read, self._ttl = read, ttl
        self._queues: dict[str, ActivitySlots] = {}
        self._read_at = float("-inf")
        # the workflow thread and the attempts' threads (answered steps) ask at once: one re-read
        # of the store when the view is stale, not one per asking thread
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = float("-inf")

    def open(self, queue: str, own_room: bool = False) -> bool:
        """Whether the activity queue is active and has a free slot (as last read); with
        ``own_room`` (the caller has a place in it already), only whether it is active."""
        with self._lock:
            if time.monotonic() - self._read_at >= self._ttl:
                try:
                    self._queues = {slots.queue: slots for slots in self._read()}
                except Exception:
                    # run nothing inline until the next read: activities take the ordinary path,
                    # which waits for the store anyway (docs/reference/contract.md §8: the machinery never fails a run)
                    self._queues = {}
                    log.info("could not read the queues; activities run inline again once they are read", exc_info=True)
                self._read_at = time.monotonic()
            slots = self._queues.get(queue)
        return slots is not None and not slots.paused and (own_room or slots.held < slots.capacity)


@attrs.frozen
class InlineActivities:
    """Which first attempts run inline, and running them (see the module docstring)."""

    worker: ActivityWorker
    queues: QueueView
    owner: str
    typical: float  # seconds: an activity runs inline while its recent attempts typically took at most this
    stopping: threading.Event
    # seconds: the same in the thread of an attempt that just ended (an answered step's chain, below)
    chained: float = 0.0

    def eligible(self, spec: NewActivityTask, room_in: str | None = None, chained: bool = False) -> bool:
        """Whether ``spec``'s first attempt may run inline; ``room_in`` names a queue where the
        step has room of its own, whatever the queue's depth (an answered step's activity,
        whose task its write deletes: one attempt after the other takes its place). A paused
        queue runs nothing inline, room or not. ``chained``: the attempt would run in the
        thread of an attempt that just ended, which is the step's own, so an activity that
        typically takes up to ``self.chained`` runs there too (see :meth:`go_on`)."""
        if spec.attempt != 1 or self.stopping.is_set() or spec.name not in self.worker.names:
            return False
        if self.worker.is_transaction(spec.name):  # its attempt is a task of its own (transaction_steps.py)
            return False
        took = self.worker.durations.typical(spec.name)
        limit = max(self.typical, self.chained) if chained else self.typical
        return took is not None and took <= limit and self.queues.open(spec.queue, own_room=spec.queue == room_in)

    def run(self, spec: NewActivityTask, now: datetime) -> Answer:
        """Run the attempt in this thread: the message its outcome gives the run, or the task
        that retries it."""
        task = first_attempt(spec, self.owner, now)
        started = time.perf_counter()
        outcome = self.worker.execute(task, heartbeat=_no_lease)  # never raises: any exception is a failure
        try:
            self.worker.finished(outcome, time.perf_counter() - started)
        except BaseException:
            log.exception("could not record the end of inline activity %s of run %s", spec.name, spec.run_id)
        message = outcome.message
        if message is None:
            assert outcome.retry_at is not None
            failure = outcome.failure if outcome.counts else None  # kept by the store as a failed attempt
            return None, attrs.evolve(spec, attempt=spec.attempt + 1, visible_from=outcome.retry_at, failure=failure)
        assert isinstance(message, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed))
        return message, None

    def go_on(
        self,
        executor: WorkflowExecutor,
        result: WorkflowTaskResult,
        *,
        until: datetime,
        clock: Clock,
        watched: Callable[[], AbstractContextManager[None]],
        room_in: str | None = None,
        chained: bool = False,
    ) -> WorkflowTaskResult:
        """Go on with the first attempts of the activities the task scheduled that may run here,
        step after step, until ``until`` (each step's workflow code runs in ``watched()``).

        ``chained``: the caller is the thread of an activity attempt that just ended (an
        answered step, first claim of its task), not the workflow thread every run shares. Its
        run's next activities that typically take up to ``self.chained`` (tens of milliseconds:
        a call to a service) then run here as well, one after the other, and the steps are
        written together, as a workflow of quick steps is: the thread was the step's anyway
        (it holds the activity slot), and what a crash before the write costs is those
        attempts run again, as any inline attempt."""
        tried: set[int] = set()
        continued = Continued(result)
        while (
            not executor.closed  # the watchdog gave the task up: no further attempt runs for it
            and continued.can_continue(executor)
            and clock.now() < until
            and continued.events < _INLINE_EVENTS
        ):
            outcomes: list[ev.ActivityTaskCompleted | ev.ActivityTaskFailed] = []
            retries: list[NewActivityTask] = []
            for spec in continued.activity_tasks:
                if spec.created_seq in tried or not self.eligible(spec, room_in, chained):
                    continue
                tried.add(spec.created_seq)
                message, retry = self.run(spec, clock.now())
                if message is not None:
                    outcomes.append(message)
                if retry is not None:
                    retries.append(retry)
            if not outcomes and not retries:
                break
            with watched():
                continued.add(executor, outcomes, retries, clock.now())
            if not outcomes:
                break
        return continued.result()


def first_attempt(spec: NewActivityTask, owner: str, now: datetime) -> ActivityTask:
    """The task of an attempt run inside its workflow task: no lease of its own (version 0)."""
    return ActivityTask(
        task_id=0,
        run_id=spec.run_id,
        created_seq=spec.created_seq,
        name=spec.name,
        input=spec.input,
        queue=spec.queue,
        priority=spec.priority,
        attempt=spec.attempt,
        retry_policy=spec.retry_policy,
        lock_timeout=spec.lock_timeout,
        lease=Lease(owner=owner, until=now + spec.lock_timeout, version=0),
        trace_context=spec.trace_context,
    )


def _no_lease() -> bool:
    return True
