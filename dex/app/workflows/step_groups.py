"""Transaction steps inside their workflow tasks: a round's steps in one transaction.

A transaction step (``@dex.transaction``) run as a task of its own costs its run a workflow
task that schedules it, a claim, its own transaction, a dispatch and the next workflow task.
On a started engine, its first attempt runs instead inside the workflow task that reached it,
the way a short activity's first attempt runs inline (:mod:`dex.app.workflows.inline`), and the
workflow round runs the steps its tasks reached **together**: the store runs them in one
transaction (:meth:`~dex.app.ports.transactions.TransactionSteps.checkpoint_steps`) and commits
with each step's writes the checkpoint of its task (the task's result so far, the task kept,
and the step's outcome in the run's inbox). Then each
task goes on from its step's outcome, as if it had come through the inbox, until it ends,
waits, or reaches the next step, which the round's next group runs.

Exactly once holds as for a step run as a task: the step's writes and its outcome commit
together, and a crash after the commit leaves the run as if the step had completed as a
task (the task is taken over once its lease ends and reads the outcome from the inbox).

Which steps run so: first attempts (``attempt == 1``) of synchronous steps at READ
COMMITTED whose recent attempts here took at most the inline limit (the first attempt in a
process always takes the ordinary path: that is how its duration becomes known), in tasks
claimed for the first time, while the activity queue has room. A failed attempt leaves the
group (which the store runs again without it: the others' functions may so run twice, and only
the run that commits counts, as with any retried transaction) and is answered as an inline
attempt's (a retry as an ordinary task, or a failure the run receives); a task whose lease or
history moved on is dropped; when the store fails the group, each step becomes a task of its
own at its first attempt (the store's failure spends none of the step's attempts). One step's
function slowing down holds the group's transaction: that is why only short steps qualify.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.app.activities.worker import ActivityWorker
from dex.app.definitions.registry import Registry
from dex.app.ports.store import ActivityOutcome, ActivityTask, Clock, WorkflowTask
from dex.app.ports.transactions import Checkpointed, CheckpointOutcome, StepCheckpoint, TransactionSteps
from dex.app.workflows.inline import InlineActivities, first_attempt
from dex.domain import events as ev
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import InboxMessage, NewActivityTask, WorkflowTaskResult, advance, can_continue, continue_task
from dex.domain.values import Payload

log = logging.getLogger("dex.worker")


@attrs.frozen(kw_only=True)
class Parked:
    """A workflow task of the round that reached a step: its executor and result so far."""

    task: WorkflowTask
    executor: WorkflowExecutor
    result: WorkflowTaskResult


Watched = Callable[[WorkflowTask, WorkflowExecutor], AbstractContextManager[None]]


@attrs.frozen
class StepGroups:
    """Which steps a round's tasks run together, and running a group (see the module docstring)."""

    store: TransactionSteps
    inline: InlineActivities
    registry: Registry
    clock: Clock
    lease: timedelta  # the workflow tasks' lease: a task goes on while at least half of it is left

    @property
    def worker(self) -> ActivityWorker:
        return self.inline.worker

    def waits(self, task: WorkflowTask, executor: WorkflowExecutor, result: WorkflowTaskResult) -> bool:
        """Whether ``result`` waits on a step that may run in a group (:meth:`step_of`)."""
        return self.step_of(task, executor, result) is not None

    def step_of(
        self, task: WorkflowTask, executor: WorkflowExecutor, result: WorkflowTaskResult
    ) -> NewActivityTask | None:
        """The first step ``result`` waits on that may run in a group, if any."""
        if task.lease.version != 1 or not can_continue(executor, result) or executor.closed:
            return None
        return next((spec for spec in result.activity_tasks if self.eligible(spec)), None)

    def eligible(self, spec: NewActivityTask) -> bool:
        inline, worker = self.inline, self.worker
        if spec.attempt != 1 or inline.stopping.is_set() or spec.name not in worker.names:
            return False
        definition = self.registry.find_activity(spec.name)
        if definition is None or definition.isolation != "read committed" or definition.is_async:
            return False
        took = worker.durations.typical(spec.name)
        return took is not None and took <= inline.typical and inline.queues.open(spec.queue)

    def run(self, parked: Sequence[Parked], watched: Watched) -> list[tuple[Parked, WorkflowTaskResult | None]]:
        """Run the steps the parked tasks wait on in one transaction of the store; then each task
        goes on from its step's outcome (workflow code in ``watched``). Each task's new result
        (as it was, if its step may no longer run in a group), or None when the task is no longer
        this worker's."""
        now = self.clock.now()
        steps: list[_Step] = []
        went_on: dict[int, WorkflowTaskResult | None] = {}
        for item in parked:
            spec = self.step_of(item.task, item.executor, item.result)
            if spec is None:  # stopping, or its queue filled meanwhile: the step becomes a task
                went_on[id(item)] = item.result
            else:
                attempt = first_attempt(spec, self.inline.owner, now)
                steps.append(_Step(item, spec, attempt, self.worker.transaction_work(attempt)))
        grouped = [step for step in steps if not isinstance(step.work, ActivityOutcome)]
        started = time.perf_counter()
        answers = self._checkpoint(grouped, now)
        seconds = (time.perf_counter() - started) / max(1, len(grouped))
        if answers is None:  # the store failed: each step becomes a task, still its first attempt
            went_on.update((id(step.item), step.item.result) for step in grouped)
        else:
            for step, answer in zip(grouped, answers, strict=True):
                went_on[id(step.item)] = self._go_on(step, answer, seconds, watched)
        for step in steps:
            if isinstance(step.work, ActivityOutcome):  # its input could not be decoded
                went_on[id(step.item)] = self._go_on(step, step.work, 0.0, watched)
        return [(item, went_on[id(item)]) for item in parked]

    def _checkpoint(self, steps: Sequence[_Step], now: datetime) -> list[CheckpointOutcome] | None:
        """Each step's answer from the store; None when the store failed (nothing was written,
        or, if it failed after its commit, the tasks' histories moved on and what they write next
        is refused)."""
        if not steps:
            return []
        items = [
            StepCheckpoint(
                task=step.item.task,
                # the step itself is answered by the checkpoint: not a task to create
                result=attrs.evolve(
                    step.item.result,
                    activity_tasks=tuple(
                        t for t in step.item.result.activity_tasks if t.created_seq != step.spec.created_seq
                    ),
                ),
                step=step.spec,
                work=step.work,
            )
            for step in steps
            if not isinstance(step.work, ActivityOutcome)
        ]
        try:
            return self.store.checkpoint_steps(items, now)
        except BaseException as exc:
            log.warning(
                "a group of %d transaction steps failed in the store; each becomes a task of its own (its"
                " first attempt still)",
                len(items),
                exc_info=not isinstance(exc, ConnectionError),
            )
            return None

    def _go_on(
        self, step: _Step, answer: CheckpointOutcome | ActivityOutcome, seconds: float, watched: Watched
    ) -> WorkflowTaskResult | None:
        if answer is None:
            return None  # the task is no longer ours: its next holder replays what was written
        task, executor, now = step.item.task, step.item.executor, self.clock.now()
        if isinstance(answer, Checkpointed):
            self._finished(ActivityOutcome(task=step.attempt, result=answer.message.result), seconds)
            inbox = [InboxMessage(message_id=answer.message_id, event=answer.message)]
            with watched(task, executor):
                result = advance(executor, answer.last_seq, inbox, now)
        else:  # nothing was written: the failure is answered as an inline attempt's
            outcome = answer if isinstance(answer, ActivityOutcome) else self.worker.failed(step.attempt, answer)
            self._finished(outcome, seconds)
            message = outcome.message
            retries = [] if message is not None else [_retry_of(step.spec, outcome)]
            outcomes = [message] if isinstance(message, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)) else []
            with watched(task, executor):
                result = continue_task(executor, step.item.result, outcomes, retries, now)
        until = task.lease.until - self.lease / 2
        return self.inline.go_on(
            executor, result, until=until, clock=self.clock, watched=lambda: watched(task, executor)
        )

    def _finished(self, outcome: ActivityOutcome, seconds: float) -> None:
        try:
            self.worker.finished(outcome, seconds)
        except BaseException:
            log.exception(
                "could not record the end of transaction step %s of run %s", outcome.task.name, outcome.task.run_id
            )


class GroupThreads:
    """Threads where a started engine's parked tasks go on (their groups, and what follows), so
    that the workflow round decides the next tasks while a group's transaction waits for the
    database; ``threads`` groups are under way at once (each run is in one of them at most).

    A group holds only steps whose recent attempts were quick, but a step's code may still
    get stuck where nothing can stop it (a ``time.sleep``, a loop): its group's session is
    ended at its ``lock_timeout`` and its slot given up (``dex.adapters.postgres.step_slots``),
    but its thread stays in the code. So a group that has run ``stall`` seconds no longer
    counts: the next groups get a thread of their own, at most ``spare`` threads beyond
    ``threads`` at once; a thread beyond ``threads`` leaves when its group ends and none
    waits. (With a fixed pool of two, two stuck groups held every later run's first step until
    its workflow task's lease ran out.)"""

    def __init__(
        self,
        threads: int,
        *,
        stall: float = 1.0,
        spare: int = 8,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threads, self._stall, self._spare, self._monotonic = threads, stall, spare, monotonic
        self._jobs: deque[Callable[[], None]] = deque()
        self._started: dict[int, float] = {}  # each running group's thread: when its group began
        self._alive = 0  # threads started that have not left
        self._idle = 0  # threads alive and not running a group
        self._made = 0  # for the threads' names
        self._closed = False
        self._overseer: threading.Thread | None = None
        # guards the jobs and the counts above, which the workflow round (submit), the group
        # threads, the overseer and stop() (close) all change; the threads wait on it for work
        self._changed = threading.Condition()

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job`` in one of the threads; False when they are closed (the engine stops)."""
        with self._changed:
            if self._closed:
                return False
            self._jobs.append(job)
            if self._overseer is None:
                self._overseer = threading.Thread(target=self._oversee, name="dex-steps-overseer", daemon=True)
                self._overseer.start()
            self._grow()
            self._changed.notify_all()  # an idle thread, and the overseer
        return True

    def _grow(self) -> bool:
        """Start a thread if the waiting groups need one (under the condition's lock)."""
        if self._idle >= len(self._jobs):
            return False
        if self._counted() >= self._threads or self._alive >= self._threads + self._spare:
            return False
        self._made += 1
        thread = threading.Thread(target=self._work, name=f"dex-steps_{self._made}", daemon=True)
        self._alive += 1
        self._idle += 1  # as good as idle: it takes a waiting group first thing
        thread.start()
        return True

    def _oversee(self) -> None:
        """While groups wait for a thread, start one when a running group has run ``stall``
        seconds (groups wait only while every counted thread is busy, so the overseer sleeps
        but for a backlog)."""
        with self._changed:
            while not self._closed:
                now = self._monotonic()
                fresh = [began for began in self._started.values() if now - began < self._stall]
                if self._idle >= len(self._jobs):
                    self._changed.wait()  # nothing waits, or threads are about to take what does
                elif fresh and self._counted() >= self._threads:
                    self._changed.wait(min(fresh) + self._stall - now)  # until the first may stall
                elif not self._grow():
                    self._changed.wait()  # at the most threads: until one ends

    def _work(self) -> None:
        """A thread's loop; it starts counted as idle (by :meth:`_grow`)."""
        me = threading.get_ident()
        while True:
            with self._changed:
                while not self._jobs and not self._closed:
                    if self._counted() > self._threads:  # a spare thread: not needed now
                        self._leave()
                        return
                    self._changed.wait()
                if not self._jobs:  # closed
                    self._leave()
                    return
                job = self._jobs.popleft()
                self._idle -= 1
                self._started[me] = self._monotonic()
                self._changed.notify_all()  # the overseer: a group began, one may wait behind it
            try:
                job()
            except BaseException:  # a job's failure must not end the thread
                log.exception("a group of transaction steps raised")
            finally:
                with self._changed:
                    del self._started[me]
                    self._idle += 1
                    self._changed.notify_all()  # for close(), and the overseer

    def _counted(self) -> int:
        """The threads alive but those whose group has run ``stall`` seconds (under the lock)."""
        now = self._monotonic()
        return self._alive - sum(1 for began in self._started.values() if now - began >= self._stall)

    def _leave(self) -> None:  # under the condition's lock
        self._alive -= 1
        self._idle -= 1
        self._changed.notify_all()

    def close(self, deadline: float) -> None:
        """Take no more jobs; wait until ``deadline`` (``time.monotonic()``) for those under way
        and those waiting for a thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            while self._started or self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)


@attrs.frozen
class _Step:
    """A parked task's step in the group: its first attempt, and the work the store runs (or
    the attempt's final failure, when its input cannot be decoded)."""

    item: Parked
    spec: NewActivityTask
    attempt: ActivityTask
    work: Callable[[Any], Payload] | ActivityOutcome


def _retry_of(spec: NewActivityTask, outcome: ActivityOutcome) -> NewActivityTask:
    assert outcome.retry_at is not None
    failure = outcome.failure if outcome.counts else None  # kept by the store as a failed attempt
    return attrs.evolve(spec, attempt=spec.attempt + 1, visible_from=outcome.retry_at, failure=failure)
