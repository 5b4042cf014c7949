"""The in-memory adapter's part of how runs end (docs/reference/contract.md §14) that a workflow
task's result writes: the steps it cancelled and the runs it started detached (``tasks.py``
calls these). The endings applied at the call are ``at_call.py``. The rules are the domain's
(:class:`~dex.domain.writes.WritePlan`, :mod:`dex.domain.endings`)."""

from __future__ import annotations

from datetime import datetime

from dex.adapters.memory.state import MemoryState
from dex.domain import events as ev
from dex.domain.endings import clashed_detached
from dex.domain.writes import WritePlan


def drop_cancelled_steps(state: MemoryState, run_id: str, plan: WritePlan) -> None:
    """Cancelled activities' tasks go, whether queued or running (a running attempt learns it at
    its heartbeat, and its outcome finds no task: it is not recorded); cancelled timers' firings
    leave the inbox. The caller holds the lock."""
    if plan.cancelled_activities:
        seqs = frozenset(plan.cancelled_activities)
        doomed = [t for t, a in state.activity_tasks.items() if a.run_id == run_id and a.created_seq in seqs]
        for task_id in doomed:
            del state.activity_tasks[task_id]
    if plan.cancelled_timers:
        timers = frozenset(plan.cancelled_timers)
        state.inbox[run_id] = [
            m
            for m in state.inbox[run_id]
            if not (isinstance(m.event, ev.TimerElapsed) and m.event.created_seq in timers)
        ]


def create_detached(state: MemoryState, plan: WritePlan, now: datetime) -> None:
    """The runs ``ctx.start_workflow`` started; one whose instance id a live run holds is kept
    as a run terminated at once, naming that run (:func:`~dex.domain.endings.clashed_detached`)."""
    for run in plan.detached_runs:
        if run.run_id in state.runs:
            continue  # (never: its id is derived from the starting run's history)
        holder = state.find_live_instance(run.created.instance_id)
        if holder is None:
            state.insert_run(run.run_id, run.created, now)
            continue
        state.insert_run(run.run_id, run.created, now)
        row = state.runs[run.run_id]
        row.history = list(clashed_detached(run, holder, now))
        completion = row.history[-2].event
        assert isinstance(completion, ev.RunCompleted)
        row.status, row.started_at, row.completed_at, row.failure = completion.status, None, now, completion.failure
        state.inbox[run.run_id] = []
