"""Forking a run (docs/reference/contract.md §11): what a new run copies of another's history, and what it starts again.

A fork is a new run of the same workflow and input whose history is the original's up to the
end of a workflow task (the *fork point*), so the steps recorded up to there are not repeated.
What was pending there is started again by the fork, as Temporal's reset and DBOS's fork do:

* an activity scheduled and not finished: a new activity task, first attempt, due at once;
* a timer not yet fired: fires at its recorded due time, or at once if that has passed;
* a child run not yet finished: a *new* child of the fork (its id is the one the fork's own
  code would give it there); the original's child is left alone, and keeps reporting to the
  original. A child with an instance id still held by a live run gets the usual clash failure;
* external events the original received after the fork point are delivered to the fork again,
  in their order (Temporal reapplies signals the same way); its cancel, suspend and resume
  requests after the fork point are not.

Everything after the fork point runs again with the code registered now: that is what a fork
is for (a run that failed on an outage or a bug, once it is fixed). The fork is a run of its
own: no parent (its outcome goes to nobody), the original's instance id (refused while a live
run holds it), queue, priority, labels and concurrency key, and ``forked_from`` naming the
original. Pure: the caller passes the new run's id and the time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import attrs

from dex.domain import events as ev
from dex.domain.task import NewActivityTask, NewRun, OutgoingMessage, WorkflowTaskResult, activity_task, child_created


@attrs.frozen(kw_only=True)
class Fork:
    """A run to create as a fork: its history up to the fork point and what it starts again."""

    run_id: str
    forked_from: str
    history: tuple[ev.HistoryEvent, ...]
    """From the fork's ``RunCreated`` to the fork point, sequence numbers as in the original."""
    activity_tasks: tuple[NewActivityTask, ...] = ()
    messages: tuple[OutgoingMessage, ...] = ()
    """To the fork itself: the pending timers' ``TimerElapsed`` and the events received again."""
    child_runs: tuple[NewRun, ...] = ()

    @property
    def created(self) -> ev.RunCreated:
        first = self.history[0].event
        assert isinstance(first, ev.RunCreated)
        return first

    @property
    def started(self) -> bool:
        """False for a fork from the run's start (its ``RunCreated``): it is created as
        ``start_workflow`` creates a run, and runs the workflow again from its input."""
        return len(self.history) > 1

    def first_task(self, run_started: int) -> WorkflowTaskResult:
        """The copied history as the result of the fork's first workflow task, consuming the
        ``RunStarted`` message (id ``run_started``) that creating the run put in its inbox.

        Adapters write a started fork as a run created as usual and then this result, through
        the path every task result takes, so its children, activity tasks and timers are made
        exactly as a worker's result makes them.
        """
        return WorkflowTaskResult(
            run_id=self.run_id,
            expected_last_seq=self.history[0].sequence_number,
            new_events=self.history[1:],
            consumed=(run_started,),
            started=True,
            activity_tasks=self.activity_tasks,
            messages=self.messages,
            child_runs=self.child_runs,
        )


def fork_points(history: Sequence[ev.HistoryEvent]) -> tuple[int, ...]:
    """Where ``history`` may be forked: its start (its ``RunCreated``: sequence number 1, unless
    the run continued as new, which numbers on), and the end (``WorkflowTaskCompleted``) of
    every workflow task before the one that ended the run, if it ended."""
    points = [history[0].sequence_number]
    ended = False
    for item in history[1:]:
        if isinstance(item.event, ev.RunCompleted):
            ended = True
        elif isinstance(item.event, ev.WorkflowTaskCompleted):
            if ended:
                break
            points.append(item.sequence_number)
    return tuple(points)


def fork_point(history: Sequence[ev.HistoryEvent], at: object, run_id: str) -> int:
    """``at`` checked against ``history`` (run ``run_id``'s), or the default when it is None:
    the end of the last workflow task before the run ended (for a live run, its last task).

    TypeError when ``at`` is not an int; ValueError, naming the problem and the points there
    are, when it is not one of :func:`fork_points`.
    """
    points = fork_points(history)
    if at is None:
        return points[-1]
    if isinstance(at, bool) or not isinstance(at, int):
        raise TypeError(f"at must be an int (a sequence number of the history), got {type(at).__name__}")
    first, last = history[0].sequence_number, history[-1].sequence_number
    if at < 1:
        raise ValueError(f"at must be a sequence number (1 or more), got {at}")
    if at > last:
        raise ValueError(f"at={at} is beyond the history of run {run_id}, which ends at {last}")
    if at in points:
        return at
    if at < first:
        raise ValueError(f"at={at} is before the history of run {run_id}, which continued as new from {first}")
    kind = next(item.kind for item in history if item.sequence_number == at)
    where = f"run {run_id} can be forked at {_show(points)}"
    if kind == "WorkflowTaskCompleted":
        raise ValueError(f"at={at} ends the workflow task that ended the run; {where}")
    raise ValueError(f"at={at} is not the end of a workflow task (event {at} is {kind}); {where}")


def _show(points: tuple[int, ...]) -> str:
    shown = ", ".join(str(p) for p in points[-8:])
    return shown if len(points) <= 8 else f"{points[0]}, ..., {shown}"


def child_run_id(run_id: str, generation: int, seq: int) -> str:
    """The id of the child a run starts with the command recorded at ``seq`` (as the
    workflow executor names it: unique per run, generation and position)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"dex:{run_id}:{generation}:{seq}"))


def plan_fork(
    history: Sequence[ev.HistoryEvent],
    at: int,
    *,
    run_id: str,
    forked_from: str,
    queue: str | None,
    code_version: str | None,
    now: datetime,
) -> Fork:
    """The fork of ``history`` at ``at`` (a point of :func:`fork_points`) as run ``run_id``: on
    ``queue`` (None: the original's), recording ``code_version`` (None: the original's)."""
    original = history[0].event
    if not isinstance(original, ev.RunCreated):
        raise ValueError("a history starts with RunCreated")
    created = attrs.evolve(
        original,
        queue=queue if queue is not None else original.queue,
        parent_run_id=None,
        code_version=code_version if code_version is not None else original.code_version,
        deadline=None,  # the original's may have passed: a fork has none (docs/reference/contract.md §14)
    )
    kept = [item for item in history if item.sequence_number <= at]
    activities: dict[int, ev.ActivityTaskCreated] = {}
    timers: dict[int, ev.TimerCreated] = {}
    children: dict[str, int] = {}  # the original's child id -> its position in ``kept``
    for index, item in enumerate(kept):
        event, seq = item.event, item.sequence_number
        match event:
            case ev.ActivityTaskCreated():
                activities[seq] = event
            case ev.ActivityTaskCompleted() | ev.ActivityTaskFailed():
                activities.pop(event.created_seq, None)
            case ev.TimerCreated():
                timers[seq] = event
            case ev.TimerElapsed():
                timers.pop(event.created_seq, None)
            case ev.ChildRunCreated():
                children[event.child_run_id] = index
            case ev.ChildRunCompleted() | ev.ChildRunFailed():
                children.pop(event.child_run_id, None)
            case _:
                pass
    kept[0] = attrs.evolve(kept[0], event=created)
    child_runs = []
    for index in children.values():
        item = kept[index]
        started = item.event
        assert isinstance(started, ev.ChildRunCreated)
        new_id = child_run_id(run_id, created.generation, item.sequence_number)
        kept[index] = attrs.evolve(item, event=attrs.evolve(started, child_run_id=new_id))
        restarted = attrs.evolve(started, child_run_id=new_id)
        child_runs.append(NewRun(run_id=new_id, created=child_created(run_id, restarted, created)))
    tasks = tuple(activity_task(run_id, seq, event, created, now) for seq, event in activities.items())
    fired = [
        OutgoingMessage(run_id=run_id, event=ev.TimerElapsed(created_seq=seq), visible_from=event.fire_at)
        for seq, event in timers.items()
    ]
    again = [
        OutgoingMessage(run_id=run_id, event=item.event, visible_from=now)
        for item in history
        if item.sequence_number > at and isinstance(item.event, ev.ExternalEventReceived)
    ]
    return Fork(
        run_id=run_id,
        forked_from=forked_from,
        history=tuple(kept),
        activity_tasks=tasks,
        messages=(*fired, *again),
        child_runs=tuple(child_runs),
    )
