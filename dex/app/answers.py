"""One write per activity: an activity's outcome answered by the engine that holds its run.

On the ordinary path an activity costs two writes: its outcome (a message in the run's inbox,
which makes the run's workflow task due), then that workflow task's result. When the engine
that ran the attempt also holds the run's executor (its cache of the run's last task), it
skips the first: the outcome goes straight to the workflow worker as an
:class:`~dex.app.ports.AnsweredStep`, a workflow task no store holds, whose inbox is the
outcome's message alone. The worker decides it as any task (the watchdog, inline activities,
held runs and refusals as usual), and its result is written with the round's others
(``complete_workflow_tasks``): the step's history, with the message in it, and the activity
task deleted under the attempt's claim — one transaction where there were two.

The store applies it only while nothing else happened to the run (see ``AnsweredStep``). In
every other case the outcome is written the ordinary way, and nothing is lost:

- the executor is no longer cached where the step expected it (evicted, or another task
  moved the run on) when the round starts;
- the run does not take the message now (suspended, or ended in its history);
- deciding failed (the store, a bug of dex, code that blocked: ``retry_later``), or the run is
  held (its history does not match the code);
- the store did not apply the result (the claim was lost, the history moved on, a workflow
  task of the run is due, its queue is paused or full) or refused it.

A crash between the hand-over and the write loses the outcome with the process, as a crash
before an ordinary outcome's flush does: the activity's lease lapses and the attempt runs
again (activities run at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from dex.app.buffer import ResultBuffer
from dex.app.executors import Cached, ExecutorCache, Preloaded
from dex.app.ports import ActivityOutcome, AnsweredStep, Lease, Loaded, Store, WorkflowInput, WorkflowTask
from dex.domain import events as ev
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import InboxMessage, WorkflowTaskResult

log = logging.getLogger("dex.worker")


def answered_step(
    outcome: ActivityOutcome, cached: Cached | None, owner: str, now: datetime, lease: timedelta
) -> tuple[AnsweredStep, WorkflowInput] | None:
    """The step ``outcome`` answers at once, with its input, when ``cached`` is the run's
    executor; None when the outcome is not for a step (a retry) or no executor is cached."""
    message = outcome.message
    if message is None or cached is None:
        return None
    created = cached.executor.created
    activity = outcome.task
    step = AnsweredStep(
        task_id=-activity.task_id,  # never a workflow task's id (the watchdog keys claims by it)
        run_id=activity.run_id,
        workflow_name=created.workflow_name,
        queue=created.queue,
        # until the attempt's claim may lapse, at most a workflow task's lease: what the
        # inline attempts of the step may use up is half of it, as in any task
        lease=Lease(owner=owner, until=min(now + lease, activity.lease.until), version=activity.lease.version),
        outcome=outcome,
        last_seq=cached.last_seq,
    )
    # a message that never was in the inbox: a negative id, left out of what the step consumed
    return step, WorkflowInput(events=[], inbox=[InboxMessage(message_id=-1, event=message)])


def answer_start(
    step: AnsweredStep, preloaded: Preloaded | None, cache: ExecutorCache
) -> tuple[Cached, list[InboxMessage]] | None:
    """What ``step`` is decided from: the executor its round took from the cache, if it still
    stands where the step expects it, and the step's one message. None otherwise (an executor
    that moved on goes back to the cache: it is valid for the run's next task)."""
    cached = preloaded.cached if preloaded is not None else None
    if preloaded is None or cached is None or cached.last_seq != step.last_seq:
        if cached is not None:
            cache.put(step.run_id, cached.executor, cached.last_seq)
        return None
    loaded = preloaded.given.loaded
    inbox = loaded.inbox if isinstance(loaded, WorkflowInput) else []
    if len(inbox) != 1 or not isinstance(inbox[0].event, ev.ActivityTaskCompleted | ev.ActivityTaskFailed):
        cache.put(step.run_id, cached.executor, cached.last_seq)
        return None
    return cached, inbox


def write_ordinarily(buffer: ResultBuffer, step: AnsweredStep, why: str) -> None:
    """The step was not answered here: write its activity's outcome the ordinary way."""
    activity = step.outcome.task
    log.debug(
        "the outcome of activity %s of run %s goes the ordinary way: %s",
        activity.name,
        activity.run_id,
        why,
        extra={"run_id": activity.run_id, "activity_name": activity.name},
    )
    try:
        buffer.add_activity_outcome(step.outcome)
    except BaseException:
        log.exception(
            "could not buffer the outcome of activity %s of run %s; it is retried when its lease expires",
            activity.name,
            activity.run_id,
            extra={"run_id": activity.run_id, "activity_name": activity.name},
        )


class AnsweredSteps:
    """The workflow worker's side of answered steps (a mixin of ``WorkflowWorker``)."""

    _store: Store
    _buffer: ResultBuffer
    _names: frozenset[str]
    _node_id: str
    _lease: timedelta
    cache: ExecutorCache

    def hand(
        self, tasks: Sequence[WorkflowTask], loaded: Sequence[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        raise NotImplementedError  # the worker's

    def answer(self, outcome: ActivityOutcome) -> bool:
        """An attempt of this engine ended: when this worker holds the run's executor, take the
        outcome as the step it answers, decided by the next round and written with it, so that
        one write records both. False: write it the ordinary way."""
        if not self._names:
            return False
        now = self._store.clock.now()
        taken = answered_step(outcome, self.cache.peek(outcome.task.run_id), self._node_id, now, self._lease)
        if taken is None:
            return False
        step, given = taken
        self.hand([step], [given], now)
        return True

    def _answer_start(
        self, step: AnsweredStep, preloaded: Preloaded | None
    ) -> tuple[WorkflowExecutor, int, list[ev.HistoryEvent], list[InboxMessage]] | None:
        """What ``step`` starts from (as ``start_point`` says for a task); None: the executor
        moved on, and the outcome went the ordinary way."""
        answering = answer_start(step, preloaded, self.cache)
        if answering is None:
            write_ordinarily(self._buffer, step, "the run's executor moved on")
            return None
        return answering[0].executor, step.last_seq, [], answering[1]

    def _answered(
        self, step: AnsweredStep, executor: WorkflowExecutor, last_seq: int, result: WorkflowTaskResult
    ) -> WorkflowTaskResult | None:
        """The result of an answered step; None when the run did not take the outcome now
        (suspended, or ended in its history): the executor stays as it was, and the outcome
        goes the ordinary way."""
        if not result.new_events:
            self.cache.put(step.run_id, executor, last_seq)
            write_ordinarily(self._buffer, step, "the run does not take it now")
            return None
        return attrs.evolve(result, consumed=())  # its message was never in the inbox
