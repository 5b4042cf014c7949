"""Run state folded from history: ``evolve(state, event) -> state``.

The engine keeps the authoritative status in its store; this fold is how the core (and the
tests) derive what a history says: the status, what is still pending, how far it got.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

import attrs

from dex.domain import events as ev
from dex.domain.status import RunStatus, transition


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


def evolve(state: RunState, event: ev.Event) -> RunState:
    """Apply one event to ``state``; raises InvalidStateError for an impossible status move."""
    match event:
        case ev.RunCreated():
            return attrs.evolve(state, workflow_name=event.workflow_name, generation=event.generation)
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
        case ev.RunSuspended():
            return attrs.evolve(state, status=transition(state.status, RunStatus.SUSPENDED), suspended=True)
        case ev.RunResumed() if not state.suspended:
            return state  # histories from before resume was refused for a CREATED run hold such a resume
        case ev.RunResumed():
            return attrs.evolve(state, status=transition(state.status, RunStatus.RUNNING), suspended=False)
        case ev.RunCancelled():
            return attrs.evolve(state, cancel_requested=True)
        case ev.RunCompleted():
            return attrs.evolve(state, status=transition(state.status, event.status))
        case _:
            assert_never(event)


def fold(history: Iterable[ev.HistoryEvent]) -> RunState:
    """The state after every event of ``history``."""
    state = RunState()
    for item in history:
        state = evolve(attrs.evolve(state, last_sequence_number=item.sequence_number), item.event)
    return state
