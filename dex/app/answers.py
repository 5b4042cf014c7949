"""One write per activity: an activity's outcome answered by the engine that holds its run.

On the ordinary path an activity costs two writes: its outcome (a message in the run's inbox,
which makes the run's workflow task due), then that workflow task's result. When the engine
that ran the attempt also holds the run's executor (its cache of the run's last task), it
skips the first: the attempt's own thread, which has nothing else to do, takes the executor
out of the cache and decides the step the outcome answers at once, as an
:class:`~dex.app.ports.AnsweredStep` — a workflow task no store holds, whose inbox is the
outcome's message alone — with what any task has (the watchdog, inline activities, held
runs, tracing, refusals). Its result goes to the buffer with the workflow worker's and is
written with them (``complete_workflow_tasks``): the step's history, with the message in it,
and the activity task deleted under the attempt's claim — one transaction where there were
two, and no hand-over to the workflow worker's thread (deciding there made the outcome wait
for that thread's rounds, which held the activity's room in its queue longer: measured
slower, BENCHMARKS.md).

The store applies it only while nothing else happened to the run (see ``AnsweredStep``). In
every other case the outcome is written the ordinary way, and nothing is lost:

- no executor of the run is cached here (evicted, never held, or another step of the run is
  being decided or written);
- the run does not take the message now (suspended, or ended in its history);
- deciding failed (the store, a bug of dex, code that blocked past the deadline: the watchdog
  gives the step back, ``retry_later``), or the run is held (its history does not match);
- the store did not apply the result (the claim was lost, the history moved on, a message or
  workflow task of the run is due, its workflow queue is paused) or refused it.

A crash between the decision and the write loses the outcome with the process, as a crash
before an ordinary outcome's flush does: the activity's lease lapses and the attempt runs
again (activities run at least once).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import attrs

from dex.app.buffer import ResultBuffer
from dex.app.executors import Cached, ExecutorCache, Given, Preloaded
from dex.app.ports import ActivityOutcome, AnsweredStep, Lease, Store, WorkflowInput, WorkflowTask
from dex.app.telemetry import Telemetry
from dex.domain import events as ev
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import InboxMessage, WorkflowTaskResult

if TYPE_CHECKING:
    from dex.app.inline import InlineActivities
    from dex.app.watchdog import Watchdog

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

    watchdog: Watchdog | None
    inline: InlineActivities | None
    _telemetry: Telemetry

    def _decide(self, task: WorkflowTask, preloaded: Preloaded | None = None) -> WorkflowTaskResult | None:
        raise NotImplementedError  # the worker's

    def _drop(self, task: WorkflowTask) -> None:
        raise NotImplementedError  # the worker's

    def answer(self, outcome: ActivityOutcome) -> bool:
        """An attempt of this engine ended: when this worker holds the run's executor, decide
        the step the outcome answers at once, in the calling thread (the attempt's, which has
        nothing else to do), and buffer its result, so that one write records both. False:
        write the outcome the ordinary way. Raises only what deciding raised past its own
        handling (a bug of dex): the caller then writes the outcome the ordinary way."""
        if not self._names or not self._answers(outcome.task.name, outcome.task.queue):
            return False
        now = self._store.clock.now()
        cached = self.cache.take(outcome.task.run_id)  # the executor is this step's alone now
        taken = answered_step(outcome, cached, self._node_id, now, self._lease)
        if taken is None:
            if cached is not None:
                self.cache.put(outcome.task.run_id, cached.executor, cached.last_seq)
            return False
        step, given = taken
        started, watchdog = time.perf_counter(), self.watchdog
        try:
            result = self._decide(step, Preloaded(cached=cached, given=Given(loaded=given, at=now)))
        except BaseException:
            if watchdog is not None and watchdog.abandoned(step):  # its interrupt: see below
                self._drop(step)
                return True
            raise
        if watchdog is not None and watchdog.abandoned(step):
            # given back while its code blocked: its outcome went the ordinary way (retry_later)
            self._drop(step)
            return True
        if result is not None:
            self._buffer.add_workflow_results([(step, result)])
            outcome_kind = "progressed" if result.completion is None else result.completion.status.value.lower()
            self._telemetry.task_finished("workflow", step.workflow_name, outcome_kind, time.perf_counter() - started)
        return True

    def _answers(self, name: str, queue: str) -> bool:
        """Whether outcomes of activity ``name`` are answered here: always without inline
        activities; with them, for an activity known to be too slow to run inline, and for a
        quick one while its queue is full (as last read), which is why it ran as a task of its
        own. One whose duration is not known yet (its first attempts in this process) takes the
        ordinary path: its run's next steps are likely to run inline, in the worker's batched
        tasks, which cost less than a step answered in each attempt's thread (measured:
        answering them too took the engine-alone batch on a cold engine from ~1,240 to ~980/s).
        So does a quick one whose queue has room, for the same reason. But in a full queue the
        ordinary path's next step would not run inline either, and every step after it would go
        the same way; an answered step runs its next ones inline in the room its own task
        leaves (``eligible(room_in=...)``). Without that, a backlog that filled the queue once
        kept every run on the ordinary path as long as starts came faster than it drains
        (the "slow steady state" of issue 26: ~525 workflows/s against ~1,600)."""
        inline = self.inline
        if inline is None:
            return True
        took = inline.worker.durations.typical(name)
        if took is None:
            return False
        return took > inline.typical or not inline.queues.open(queue)

    def _answer_start(
        self, step: AnsweredStep, preloaded: Preloaded | None
    ) -> tuple[WorkflowExecutor, int, list[ev.HistoryEvent], list[InboxMessage]] | None:
        """What ``step`` starts from (as ``start_point`` says for a task): the executor
        ``answer`` took from the cache, and the step's one message. None (the outcome then goes
        the ordinary way) only if something other than ``answer`` asked."""
        cached = preloaded.cached if preloaded is not None else None
        loaded = preloaded.given.loaded if preloaded is not None else None
        if cached is None or not isinstance(loaded, WorkflowInput):
            write_ordinarily(self._buffer, step, "no executor of the run was at hand")
            return None
        return cached.executor, step.last_seq, [], loaded.inbox

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
