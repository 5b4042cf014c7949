"""Run state folded from history: ``evolve(state, event) -> state``.

The engine keeps the authoritative status in its store; this fold is how the core (and the
tests) derive what a history says: the status, what is still pending, how far it got, what the
run published and streamed, its labels and the updates it answered.

One invariant holds for every history (docs/reference/contract.md §14): nothing is recorded
after a run's terminal event but the ``WorkflowTaskCompleted`` that closes its block; the fold
raises InvalidStateError for a history that breaks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TypeVar, assert_never

import attrs

from dex.domain import events as ev
from dex.domain.errors import InvalidStateError
from dex.domain.status import RunStatus, transition
from dex.domain.values import Payload

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class RunState:
    """What a history says about a run."""

    status: RunStatus = RunStatus.CREATED
    workflow_name: str = ""
    generation: int = 0
    last_sequence_number: int = 0
    pending_activities: frozenset[int] = frozenset()
    pending_timers: frozenset[int] = frozenset()
    pending_children: tuple[str, ...] = ()
    suspended: bool = False
    cancel_requested: bool = False
    in_workflow_task: bool = False
    labels: ev.Labels = ()
    deadline: datetime | None = None
    published: tuple[tuple[str, Payload], ...] = ()
    """The latest value published under each key, in the order the keys were first published."""
    streams: tuple[tuple[str, int], ...] = ()
    """How many items each stream holds, in the order the streams were first written."""
    closed_streams: frozenset[str] = frozenset()
    pending_updates: tuple[str, ...] = ()
    """Updates accepted and not yet answered, in the order they were accepted."""
    answered_updates: frozenset[str] = frozenset()
    detached_runs: tuple[str, ...] = ()
    terminate_reason: str | None = None


def evolve(state: RunState, event: ev.Event) -> RunState:
    """Apply one event to ``state``; raises InvalidStateError for an impossible status move or
    for anything but the closing ``WorkflowTaskCompleted`` after the terminal event."""
    if state.status.is_terminal and not isinstance(event, ev.WorkflowTaskCompleted):
        raise InvalidStateError(
            f"{type(event).__name__} recorded after the run ended {state.status.value}: nothing may follow the terminal event"
        )
    match event:
        case ev.RunCreated():
            return attrs.evolve(
                state,
                workflow_name=event.workflow_name,
                generation=event.generation,
                labels=event.labels,
                deadline=event.deadline,
                closed_streams=frozenset(event.closed_streams),
            )
        case ev.RunStarted():
            return attrs.evolve(state, status=transition(state.status, RunStatus.RUNNING))
        case ev.WorkflowTaskStarted():
            return attrs.evolve(state, in_workflow_task=True)
        case ev.WorkflowTaskCompleted():
            return attrs.evolve(state, in_workflow_task=False)
        case ev.ActivityTaskCreated():
            return attrs.evolve(state, pending_activities=state.pending_activities | {state.last_sequence_number})
        case ev.ActivityTaskCompleted() | ev.ActivityTaskFailed():
            return attrs.evolve(state, pending_activities=state.pending_activities - {event.created_seq})
        case ev.TimerCreated():
            return attrs.evolve(state, pending_timers=state.pending_timers | {state.last_sequence_number})
        case ev.TimerElapsed():
            return attrs.evolve(state, pending_timers=state.pending_timers - {event.created_seq})
        case ev.ChildRunCreated():
            return attrs.evolve(state, pending_children=(*state.pending_children, event.child_run_id))
        case ev.ChildRunCompleted() | ev.ChildRunFailed():
            children = tuple(c for c in state.pending_children if c != event.child_run_id)
            return attrs.evolve(state, pending_children=children)
        case ev.ExternalEventReceived() | ev.SideEffectExecuted() | ev.PatchApplied():
            return state
        case ev.RunSuspended() if state.cancel_requested:
            return state  # a cancelling run is not held back: its cleanup must run
        case ev.RunSuspended():
            return attrs.evolve(state, status=transition(state.status, RunStatus.SUSPENDED), suspended=True)
        case ev.RunResumed() if not state.suspended:
            return state  # histories from before resume was refused for a CREATED run hold such a resume
        case ev.RunResumed():
            return attrs.evolve(state, status=transition(state.status, RunStatus.RUNNING), suspended=False)
        case ev.RunCancelled() if state.cancel_requested:
            return state  # a second request changes nothing: cleanup steps started since stay pending
        case ev.RunCancelled():
            # the request cancels every pending activity and timer (children are sent it too and
            # stay pending until their outcome arrives); a suspended run resumes to clean up
            if state.suspended:
                state = attrs.evolve(state, status=transition(state.status, RunStatus.RUNNING), suspended=False)
            return attrs.evolve(
                state, cancel_requested=True, pending_activities=frozenset(), pending_timers=frozenset()
            )
        case ev.RunCompleted():
            if (event.status is RunStatus.TERMINATED) != (state.terminate_reason is not None):
                raise InvalidStateError("a run ends TERMINATED exactly when a RunTerminated precedes its end")
            return attrs.evolve(state, status=transition(state.status, event.status))
        case ev.RunTerminated():
            return attrs.evolve(state, terminate_reason=event.reason)
        case ev.UpdateRequested():
            raise InvalidStateError(
                "an UpdateRequested is an inbox message, never history (it is recorded as UpdateAccepted)"
            )
        case ev.UpdateAccepted():
            if event.update_id in state.pending_updates or event.update_id in state.answered_updates:
                raise InvalidStateError(f"update {event.update_id!r} accepted twice")
            return attrs.evolve(state, pending_updates=(*state.pending_updates, event.update_id))
        case ev.UpdateCompleted():
            if event.update_id not in state.pending_updates:
                raise InvalidStateError(f"update {event.update_id!r} answered without being accepted, or twice")
            return attrs.evolve(
                state,
                pending_updates=tuple(u for u in state.pending_updates if u != event.update_id),
                answered_updates=state.answered_updates | {event.update_id},
            )
        case ev.ValuePublished():
            return attrs.evolve(state, published=_put(state.published, event.key, event.value))
        case ev.StreamItemWritten():
            if event.key in state.closed_streams:
                raise InvalidStateError(f"stream {event.key!r} written after it was closed")
            count = dict(state.streams).get(event.key, 0)
            return attrs.evolve(state, streams=_put(state.streams, event.key, count + 1))
        case ev.StreamClosed():
            return attrs.evolve(state, closed_streams=state.closed_streams | {event.key})
        case ev.LabelsChanged():
            labels = {key: value for key, value in state.labels if key not in event.removed}
            labels.update(event.set)
            return attrs.evolve(state, labels=tuple(sorted(labels.items())))
        case ev.CancelRequested():
            # an activity or timer the code cancelled is no longer awaited; a child stays pending
            # until its outcome arrives (it may clean up first)
            return attrs.evolve(
                state,
                pending_activities=state.pending_activities - {event.created_seq},
                pending_timers=state.pending_timers - {event.created_seq},
            )
        case ev.DetachedRunCreated():
            return attrs.evolve(state, detached_runs=(*state.detached_runs, event.run_id))
        case _:
            assert_never(event)


def _put(pairs: tuple[tuple[str, T], ...], key: str, value: T) -> tuple[tuple[str, T], ...]:
    """``pairs`` with ``key`` set to ``value``: in place if present, else appended."""
    if any(k == key for k, _ in pairs):
        return tuple((k, value if k == key else v) for k, v in pairs)
    return (*pairs, (key, value))


def fold(history: Iterable[ev.HistoryEvent]) -> RunState:
    """The state after every event of ``history``."""
    state = RunState()
    for item in history:
        state = evolve(attrs.evolve(state, last_sequence_number=item.sequence_number), item.event)
    return state
