"""Runs ended at the call, without their workflow code (docs/reference/contract.md §14, §15).

:func:`dex.domain.task.terminate` decides ``engine.terminate`` from the history alone;
:func:`terminated` is that, counting the events dropped with the inbox as unread. This module
also decides the two other endings a store applies at the call, as one workflow task's result,
because no workflow code will (or can) decide them:

* :func:`cancel_unstarted`: ``engine.cancel`` of a CREATED run that no engine can run (no live
  engine registers its workflow): the block a worker would record for a cancel that reached the
  run before its first line (``RunStarted``, ``RunCancelled``, the CANCELLED outcome), which
  replays the same way when code for it appears later.
* :func:`clashed_detached`: a run ``ctx.start_workflow`` started whose instance id a live run
  already holds. Its id was returned to the workflow code and recorded, so it must name a run:
  it is kept as a run TERMINATED at once, its failure naming the run that holds the instance id.

And what a write plan writes when one task both made and cancelled a step
(:func:`kept_activity_tasks`, :func:`kept_messages`): neither the task nor the firing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from dex.domain import events as ev
from dex.domain.state import fold
from dex.domain.status import RunStatus
from dex.domain.task import (
    NO_EFFECTS,
    InboxMessage,
    NewActivityTask,
    NewRun,
    OutgoingMessage,
    RunEffects,
    UpdateAnswer,
    WorkflowTaskResult,
    terminate,
)
from dex.domain.values import FailureInfo
from dex.domain.writes import WritePlan


def terminated(
    run_id: str, history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage], reason: str, now: datetime
) -> WorkflowTaskResult:
    """:func:`~dex.domain.task.terminate`, counting the events its inbox held as unread: they are
    dropped with the inbox, and no code will ever read them. (Events already recorded that the
    code had not read are not known without the code, which a terminate does not run.)"""
    result = terminate(run_id, history, inbox, reason, now)
    if result.completion is None:
        return result
    effects = result.effects or NO_EFFECTS
    return attrs.evolve(result, effects=attrs.evolve(effects, unread_events=_inbox_events(inbox)))


def _inbox_events(inbox: Sequence[InboxMessage]) -> int:
    return sum(isinstance(m.event, ev.ExternalEventReceived) for m in inbox)


def cancel_unstarted(
    run_id: str, history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage], reason: str, now: datetime
) -> WorkflowTaskResult | None:
    """The result that ends a run not yet started CANCELLED, consuming its whole inbox; None if
    the run has started (or ended): then the cancel goes to its code as a request."""
    if fold(history).status is not RunStatus.CREATED:
        return None
    created = history[0].event
    assert isinstance(created, ev.RunCreated)
    last_seq = history[-1].sequence_number
    text = "the run was cancelled" + (f": {reason}" if reason else "")
    failure = FailureInfo(type="WorkflowCancelledError", message=text, terminal=True)
    completion = ev.RunCompleted(status=RunStatus.CANCELLED, failure=failure)
    events: list[ev.Event] = [
        ev.WorkflowTaskStarted(),
        ev.RunStarted(),
        ev.RunCancelled(reason=reason),
        completion,
        ev.WorkflowTaskCompleted(),
    ]
    messages = []
    if created.parent_run_id is not None:
        outcome = ev.ChildRunFailed(child_run_id=run_id, failure=failure)
        messages.append(OutgoingMessage(run_id=created.parent_run_id, event=outcome, visible_from=now))
    return WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last_seq,
        new_events=tuple(
            ev.HistoryEvent(sequence_number=last_seq + 1 + i, timestamp=now, event=event)
            for i, event in enumerate(events)
        ),
        consumed=tuple(m.message_id for m in inbox),
        started=True,
        completion=completion,
        messages=tuple(messages),
        effects=RunEffects(update_answers=refused_updates(inbox), unread_events=_inbox_events(inbox)),
    )


def clashed_detached(run: NewRun, holder: str, now: datetime) -> tuple[ev.HistoryEvent, ...]:
    """The whole history of a detached run that did not start because ``holder`` holds its
    instance id: created, then terminated in its first workflow task (no code ran)."""
    first = ev.HistoryEvent(sequence_number=1, timestamp=now, event=run.created)
    reason = f"instance id {run.created.instance_id!r} is in use by run {holder}"
    return (first, *terminate(run.run_id, [first], (), reason, now).new_events)


def refused_updates(inbox: Sequence[InboxMessage]) -> tuple[UpdateAnswer, ...]:
    """Answers to the update requests in the inbox of a run that ends without running code."""
    failure = FailureInfo(type="InvalidStateError", message="the run has ended", terminal=True)
    return tuple(
        UpdateAnswer(update_id=m.event.update_id, failure=failure, rejected=True)
        for m in inbox
        if isinstance(m.event, ev.UpdateRequested)
    )


def kept_activity_tasks(plan: WritePlan) -> tuple[NewActivityTask, ...]:
    """The plan's new activity tasks but those it cancels too (created and cancelled in one task)."""
    if not plan.cancelled_activities:
        return plan.activity_tasks
    cancelled = frozenset(plan.cancelled_activities)
    return tuple(t for t in plan.activity_tasks if t.created_seq not in cancelled)


def kept_messages(run_id: str, plan: WritePlan) -> tuple[OutgoingMessage, ...]:
    """The plan's messages but the firings of the timers it cancels (a timer may be created and
    cancelled in one task: its firing must not be written either)."""
    if not plan.cancelled_timers:
        return plan.messages
    cancelled = frozenset(plan.cancelled_timers)
    return tuple(
        m
        for m in plan.messages
        if not (m.run_id == run_id and isinstance(m.event, ev.TimerElapsed) and m.event.created_seq in cancelled)
    )
