"""Transaction steps inside their workflow tasks: a round's steps in one transaction.

A transaction step (``@dex.transaction``) run as a task of its own costs its run a workflow
task that schedules it, a claim, its own transaction, a dispatch and the next workflow task.
On a started engine, its first attempt runs instead inside the workflow task that reached it,
the way a short activity's first attempt runs inline (:mod:`dex.app.inline`), and the
workflow round runs the steps its tasks reached **together**: the store runs them in one
transaction (:meth:`~dex.app.transaction_ports.TransactionSteps.checkpoint_steps`) and commits
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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.app.activity_worker import ActivityWorker
from dex.app.inline import InlineActivities, first_attempt
from dex.app.ports import ActivityOutcome, ActivityTask, Clock, WorkflowTask
from dex.app.registry import Registry
from dex.app.transaction_ports import Checkpointed, CheckpointOutcome, StepCheckpoint, TransactionSteps
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
    database; several groups are under way at once (each run is in one of them at most)."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dex-steps")
        self._running: set[Future[None]] = set()
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job`` in one of the threads; False when they are closed (the engine stops)."""
        with self._lock:
            try:
                future = self._pool.submit(job)
            except RuntimeError:  # shut down
                return False
            self._running.add(future)
        future.add_done_callback(self._ended)
        return True

    def _ended(self, future: Future[None]) -> None:
        with self._lock:
            self._running.discard(future)

    def close(self, deadline: float) -> None:
        """Take no more jobs; wait until ``deadline`` (``time.monotonic()``) for those under way."""
        with self._lock:
            self._pool.shutdown(wait=False)
            running = list(self._running)
        wait(running, timeout=max(0.0, deadline - time.monotonic()))


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
    return attrs.evolve(spec, attempt=spec.attempt + 1, visible_from=outcome.retry_at)
