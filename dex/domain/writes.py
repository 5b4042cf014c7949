"""What a finished workflow task writes: the store-side rules, stated once for every adapter.

:func:`dex.domain.task.decide` says what a workflow task did; this module says what the store
does with it, so that the in-memory adapter and PostgreSQL execute the same plan instead of
each re-stating the rules:

* :func:`plan_write` turns a :class:`~dex.domain.task.WorkflowTaskResult` and the run's status
  into a :class:`WritePlan`: the history block, whether it replaces the history
  (continue-as-new), the messages consumed, the run's new status, whether its custom status is
  set, and whether the run ends (its inbox and pending activity tasks are then dropped, and
  messages to it are not written).
* :data:`SURVIVES_CONTINUE_AS_NEW`: which messages a run's inbox keeps when it continues as
  new (events and requests addressed to the run; timers and activity results belong to the
  old generation).
* :func:`instance_clash`: the message a parent gets when its child's instance id is held by a
  live run (only the store knows which children clashed, so it asks per child);
  :func:`reused_outcome`: the one it gets when an ended run of the id answers under ``id_reuse``.
* :func:`dropped_update_answers`: the answers to update requests that a run's end drops.
* :data:`WAKES_SUSPENDED`: the messages that make a suspended run's workflow task due.
* :data:`INBOX_ORDER`: the order in which a run sees its visible messages.

Set-based SQL cannot call Python per row, so PostgreSQL takes these as parameters (the kind
names of :data:`SURVIVING_KINDS` and :data:`WAKING_KINDS`, the columns of
:data:`INBOX_ORDER`); the unit tests check that both adapters use these definitions.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import (
    NO_EFFECTS,
    NewActivityTask,
    NewRun,
    OutgoingMessage,
    RunEffects,
    StreamItem,
    UpdateAnswer,
    WorkflowTaskResult,
)
from dex.domain.values import FailureInfo, Payload

SURVIVES_CONTINUE_AS_NEW: tuple[type[ev.Message], ...] = (
    ev.ExternalEventReceived,
    ev.RunCancelled,
    ev.RunSuspended,
    ev.RunResumed,
    ev.RunTerminated,
    ev.UpdateRequested,
)
"""The messages an unconsumed inbox keeps across continue-as-new; all others are dropped."""

SURVIVING_KINDS: tuple[str, ...] = tuple(kind.__name__ for kind in SURVIVES_CONTINUE_AS_NEW)
""":data:`SURVIVES_CONTINUE_AS_NEW` by name, as stored in an inbox row's ``kind``."""

WAKES_SUSPENDED: tuple[type[ev.Message], ...] = (ev.RunCancelled, ev.RunTerminated)
"""The messages that make a suspended run's workflow task due (it still must be able to end)."""

WAKING_KINDS: tuple[str, ...] = tuple(kind.__name__ for kind in WAKES_SUSPENDED)
""":data:`WAKES_SUSPENDED` by name, as stored in an inbox row's ``kind``."""

INBOX_ORDER: tuple[str, str] = ("visible_from", "message_id")
"""A run sees its visible messages by the time each became visible, then in arrival order: a
timer inserted early but due late must not overtake an event that arrived before it fired."""


def survives_continue_as_new(message: ev.Message) -> bool:
    """Whether an unconsumed message stays in the inbox when its run continues as new."""
    return isinstance(message, SURVIVES_CONTINUE_AS_NEW)


def wakes_suspended(message: ev.Message) -> bool:
    """Whether a visible message makes a suspended run's workflow task due."""
    return isinstance(message, WAKES_SUSPENDED)


def dropped_update_answers(messages: Iterable[ev.Message]) -> tuple[UpdateAnswer, ...]:
    """The answers to the update requests among the messages a run's end drops from its inbox
    (sent after its last task was loaded): refused, so that no caller of ``engine.update``
    waits for an answer that would never come."""
    failure = FailureInfo(type="InvalidStateError", message="the run has ended", terminal=True)
    return tuple(
        UpdateAnswer(update_id=m.update_id, failure=failure, rejected=True)
        for m in messages
        if isinstance(m, ev.UpdateRequested)
    )


def instance_clash(child: NewRun) -> ev.ChildRunFailed:
    """The message to the parent of a child whose instance id a live run already holds."""
    failure = FailureInfo(
        type="InvalidStateError",
        message=f"instance id {child.created.instance_id!r} is in use by a running run",
        terminal=True,
    )
    return ev.ChildRunFailed(child_run_id=child.run_id, failure=failure)


def reused_outcome(
    child: NewRun, status: RunStatus, result: Payload | None, failure: FailureInfo | None
) -> ev.ChildRunCompleted | ev.ChildRunFailed:
    """The message to the parent of a child that an ended run of its instance id answers
    (``id_reuse``, docs/reference/contract.md §15): that run's outcome, as if the child had ended so."""
    if status is RunStatus.COMPLETED and result is not None:
        return ev.ChildRunCompleted(child_run_id=child.run_id, result=result)
    if failure is None:
        failure = FailureInfo(
            type="WorkflowCancelledError",
            message=f"the run that instance id {child.created.instance_id!r} names ended {status.value}",
            terminal=True,
        )
    return ev.ChildRunFailed(child_run_id=child.run_id, failure=failure)


@attrs.frozen(kw_only=True, slots=True)
class WritePlan:
    """What the store writes for one applied workflow-task result (the lease and the
    ``expected_last_seq`` check have passed). Adapters execute it; they decide nothing."""

    events: tuple[ev.HistoryEvent, ...]
    """The history block to write (none if empty): appended, or the whole new history."""
    replaces_history: bool
    """Continue-as-new: the old history goes, and of the unconsumed inbox only the messages
    that :func:`survives_continue_as_new` stay."""
    last_seq: int | None
    """The run's last sequence number after the write; None if it does not change."""
    consumed: tuple[int, ...]
    """Inbox message ids to delete."""
    status: RunStatus
    started: bool
    """The run starts now (record its start time)."""
    sets_custom_status: bool
    custom_status: str | None
    completion: ev.RunCompleted | None
    """The run's outcome, if it ends: its inbox and pending activity tasks are then dropped,
    and no message is written to it afterwards. No transition check: a suspend that raced
    with the run's last task loses to its outcome."""
    child_runs: tuple[NewRun, ...]
    """Runs to create; one whose instance id is held gets the parent :func:`instance_clash`."""
    activity_tasks: tuple[NewActivityTask, ...]
    messages: tuple[OutgoingMessage, ...]
    """Messages to insert, after the children's RunStarted or clash messages, in this order;
    those to unknown or ended runs are dropped."""
    effects: RunEffects = NO_EFFECTS
    """What docs/decisions/conversations.md says the store does (docs/reference/contract.md §14),
    read through the properties below: update answers, published values, stream items, labels,
    cancelled steps, detached runs, unread events."""

    @property
    def update_answers(self) -> tuple[UpdateAnswer, ...]:
        """Answers for the callers of ``engine.update``, kept by update id."""
        return self.effects.update_answers

    @property
    def published(self) -> tuple[tuple[str, Payload], ...]:
        """Published values in order: the latest per key is kept."""
        return self.effects.published

    @property
    def stream_items(self) -> tuple[StreamItem, ...]:
        return self.effects.stream_items

    @property
    def streams_closed(self) -> tuple[str, ...]:
        return self.effects.streams_closed

    @property
    def labels(self) -> ev.Labels | None:
        """The run's labels replaced by these, when they changed."""
        return self.effects.labels

    @property
    def cancelled_activities(self) -> tuple[int, ...]:
        """Pending activity tasks of the run (by created seq): dropped if queued, flagged if running."""
        return self.effects.cancelled_activities

    @property
    def cancelled_timers(self) -> tuple[int, ...]:
        """Timers of the run (by created seq) whose TimerElapsed is deleted from its inbox."""
        return self.effects.cancelled_timers

    @property
    def detached_runs(self) -> tuple[NewRun, ...]:
        """Runs to create with no parent; one whose instance id is held is not created."""
        return self.effects.detached_runs

    @property
    def unread_events(self) -> int:
        return self.effects.unread_events

    @property
    def ends_run(self) -> bool:
        return self.completion is not None


def plan_write(result: WorkflowTaskResult, status: RunStatus) -> WritePlan:
    """The writes of ``result`` to a run whose status is ``status`` now."""
    if result.new_history is not None:
        events, replaces = result.new_history, True
        last_seq: int | None = events[-1].sequence_number if events else 0
    else:
        events, replaces = result.new_events, False
        last_seq = events[-1].sequence_number if events else None
    started = result.started and status is RunStatus.CREATED
    completion = result.completion
    if completion is not None:
        status = completion.status
    elif started or (result.resumed and status is RunStatus.SUSPENDED):
        status = RunStatus.RUNNING
    return WritePlan(
        events=events,
        replaces_history=replaces,
        last_seq=last_seq,
        consumed=result.consumed,
        status=status,
        started=started,
        sets_custom_status=bool(result.new_events),
        custom_status=result.custom_status,
        completion=completion,
        child_runs=result.child_runs,
        activity_tasks=result.activity_tasks,
        messages=result.messages,
        effects=result.effects or NO_EFFECTS,
    )
