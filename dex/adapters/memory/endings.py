"""The in-memory adapter's part of how runs end (docs/reference/contract.md §14): the steps a
workflow task cancelled, the runs it started detached, and the endings applied at the call
(``engine.terminate``, the cancel of a run no engine can run). Part of
:class:`dex.adapters.memory.InMemoryAdapter`; the rules are the domain's
(:class:`~dex.domain.writes.WritePlan`, :mod:`dex.domain.endings`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.app.ports.endings import Decide
from dex.domain import events as ev
from dex.domain.endings import clashed_detached
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage
from dex.domain.writes import INBOX_ORDER, WritePlan

if TYPE_CHECKING:  # tasks.py imports this module
    from dex.adapters.memory.tasks import MemoryTasks


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


class MemoryEndings:
    """Endings applied at the call, as a workflow task's result that no worker ran."""

    def __init__(self, state: MemoryState, tasks: MemoryTasks) -> None:
        self._state, self._tasks = state, tasks

    def end_run(self, run_id: str, decide: Decide, now: datetime) -> bool:
        storable.text(run_id, "run_id")
        with self._state.lock:
            row = self._state.live_run(run_id)
            visible = sorted(
                (m for m in self._state.inbox[run_id] if m.visible_from <= now),
                key=lambda m: tuple(getattr(m, f) for f in INBOX_ORDER),
            )
            inbox = [InboxMessage(message_id=m.message_id, event=m.event) for m in visible]
            result = decide(list(row.history), inbox)
            if result is None:
                return False
            storable.workflow_results([(None, result)])
            # a worker's claim of the run's task is void: its result no longer matches the history
            task_id = self._state.workflow_task_of_run.pop(run_id, None)
            if task_id is not None:
                del self._state.workflow_tasks[task_id]
            self._tasks.apply_result(run_id, result, now)
            if row.status is RunStatus.CREATED:  # (never: the result ends the run)
                raise AssertionError(f"run {run_id}: an ending that did not end it")
            return True
