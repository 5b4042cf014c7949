"""One write per activity: an activity's outcome answered by the engine that holds its run.

On the ordinary path an activity costs two writes: its outcome (a message in the run's inbox,
which makes the run's workflow task due), then that workflow task's result. When the engine
that ran the attempt also holds the run's executor (its cache of the run's last task), it
skips the first: the attempt's own thread, which has nothing else to do, takes the executor
out of the cache and decides the step the outcome answers at once, as an
:class:`~dex.app.ports.store.AnsweredStep` — a workflow task no store holds, whose inbox is the
outcome's message alone — with what any task has (the watchdog, inline activities, held
runs, tracing, refusals). Its result goes to the buffer with the workflow worker's and is
written with them (``complete_workflow_tasks``): the step's history, with the message in it,
and the activity task deleted under the attempt's claim — one transaction where there were
two, and no hand-over to the workflow worker's thread (deciding there made the outcome wait
for that thread's rounds, which held the activity's room in its queue longer: measured
slower, docs/decisions/answered-and-chained-steps.md).

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
from datetime import datetime, timedelta

from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import ActivityOutcome, AnsweredStep, Lease, WorkflowInput
from dex.app.workflows.executors import Cached
from dex.domain.task import InboxMessage

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
