"""The coordinator of a started engine: one owner of its scheduling state, advanced by a pure
transition function.

Everything a started engine decides about *when* to do work lives in one value, :class:`State`:
which queues may hold work for this process, when each poller last claimed, the batch windows,
the activity pool's reserved slots and the attempts running there, whether the engine stops.
:func:`transition` takes that state and an event (a nudge, a flush done, a scheduler or worker
turn, an attempt finished, a stop requested) and returns the next state and the commands to
carry out: wake these threads, run this attempt, claim this many tasks, wait this long. No I/O,
no clock (the time comes in the events), no lock: tests and the simulator drive it step by step.

:class:`Coordinator` is the only mutable part: it holds the state behind a lock, applies events,
and carries out the commands that are its own (waking threads, handing an attempt to the pool);
the others (a claim, a scheduling round, a pause) go back to the caller, a round of
:mod:`dex.app.runtime.rounds` run by an engine thread or by the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import attrs

from dex.app.ports.store import ACTIVITY, WORKFLOW, ActivityTask
from dex.app.runtime.coordination import (
    ActivitiesClaimed,
    AttemptEnded,
    AttemptKey,
    Claim,
    ClaimTurn,
    Command,
    Event,
    Flushed,
    Leading,
    Nudged,
    Pause,
    QueuesChanged,
    ReportDepths,
    ReserveActivities,
    RunAttempt,
    RunScheduler,
    ScheduleActivities,
    Scheduled,
    SchedulerTurn,
    StopRequested,
    TaskWritten,
    Wake,
    WorkflowRound,
)

__all__ = [
    "ActivitiesClaimed",
    "AttemptEnded",
    "AttemptKey",
    "Claim",
    "ClaimTurn",
    "Command",
    "Coordinator",
    "Event",
    "Flushed",
    "Leading",
    "Nudged",
    "Pause",
    "QueuesChanged",
    "ReportDepths",
    "ReserveActivities",
    "RunAttempt",
    "RunScheduler",
    "ScheduleActivities",
    "Scheduled",
    "SchedulerTurn",
    "Settings",
    "State",
    "StopRequested",
    "TaskWritten",
    "Wake",
    "WorkflowRound",
    "attempt_key",
    "transition",
    "window_left",
]

# the topics of the engine's wake-up calls: each thread listens to one (runner.Nudge)
SCHEDULER, WORKFLOWS, ACTIVITIES, FLUSHER = "scheduler", "workflows", "activities", "flusher"
# what a flush may leave for others (buffer.SCHEDULING: the scheduler must make tasks)
SCHEDULING = "scheduling"
# a wanted item: the activity scheduler should run (a flush or a queue change asks)
SCHEDULE_ACTIVITIES = "schedule-activities"
# after this many seconds the leader reports the queues' depths again
DEPTHS_EVERY = 5.0

_TOPIC_OF_WINDOW = {SCHEDULER: SCHEDULER, WORKFLOW: WORKFLOWS, ACTIVITY: ACTIVITIES}
_KIND_OF_TOPIC = {WORKFLOWS: WORKFLOW, ACTIVITIES: ACTIVITY}
_LEFT_TO_TOPIC = ((WORKFLOW, WORKFLOWS), (ACTIVITY, ACTIVITIES), (SCHEDULING, SCHEDULER))
_EVERY_TOPIC: frozenset[str] = frozenset()  # a wake without topics wakes every thread


def attempt_key(task: ActivityTask) -> AttemptKey:
    """The key of one claim's attempt (a task claimed again while an earlier attempt still runs
    is another attempt)."""
    return task.task_id, task.lease.version


@attrs.frozen
class Settings:
    """The engine's options that the transitions read."""

    poll_interval: float
    window: float  # the batch window, seconds (0: no pacing)
    activity_capacity: int  # the activity pool's threads
    activity_batch: int  # the most activity tasks one claim takes
    workflow_batch: int  # the most workflow tasks one scheduler round makes
    runs_activities: bool = True  # whether this engine registers any activity


@attrs.frozen
class State:
    """A started engine's scheduling state (see the module docstring)."""

    stopping: bool = False
    wanted: frozenset[str] = frozenset()  # WORKFLOW, ACTIVITY: claim; SCHEDULE_ACTIVITIES
    claimed_at: Mapping[str, float] = attrs.Factory(dict)  # kind -> when its last claim began
    worked_at: Mapping[str, float] = attrs.Factory(dict)  # window key -> a round that found work began
    full_at: Mapping[str, float] = attrs.Factory(dict)  # window key -> last time it was declared full
    used: int = 0  # activity slots reserved or running
    running: Mapping[AttemptKey, ActivityTask] = attrs.Factory(dict)  # attempts handed to the pool
    backlog: bool = False  # the activity queue may hold more than the last claim took
    activities_scheduled_at: float = float("-inf")
    depths_at: float = float("-inf")

    def replace(self, **changes: Any) -> State:
        """``attrs.evolve(self, **changes)`` without its walk over the fields' definitions: every
        event a started engine's coordinator takes makes one or two states (half the time)."""
        if not changes.keys() <= _STATE_FIELDS:
            raise TypeError(f"State has no field {sorted(changes.keys() - _STATE_FIELDS)}")
        get = changes.get
        return State(
            get("stopping", self.stopping),
            get("wanted", self.wanted),
            get("claimed_at", self.claimed_at),
            get("worked_at", self.worked_at),
            get("full_at", self.full_at),
            get("used", self.used),
            get("running", self.running),
            get("backlog", self.backlog),
            get("activities_scheduled_at", self.activities_scheduled_at),
            get("depths_at", self.depths_at),
        )


_STATE_FIELDS = frozenset(field.name for field in attrs.fields(State))
Step: TypeAlias = tuple[State, tuple[Command, ...]]
_NOTHING: tuple[Command, ...] = ()


# -- the batch window (pure) ---------------------------------------------------------------------
def window_left(settings: Settings, state: State, key: str, now: float) -> float:
    """Seconds before the next round of ``key`` may start (0: at once).

    Under load a poller's rounds come at most once per window, so that batches grow instead of
    rounds: a round within ``window`` seconds of the start of a round that found work waits for
    the rest of it. A round after a quiet spell runs at once, and work handed over by eager
    dispatch never waits. ``_full`` ends a window early (the round took all it could, or more
    became available to it)."""
    worked_at = state.worked_at.get(key)
    if worked_at is None or settings.window <= 0:
        return 0.0
    return max(0.0, worked_at + settings.window - now)


def _worked(state: State, key: str, started: float) -> State:
    """A round of ``key`` that began at ``started`` found work: its window runs from then; unless
    it was declared full since it began (more arrived meanwhile: the next round runs at once)."""
    if state.full_at.get(key, float("-inf")) > started:
        return state
    return state.replace(worked_at={**state.worked_at, key: started})


def _full(state: State, key: str, now: float) -> tuple[State, Command]:
    """``key``'s next round runs at once; its poller, if waiting out a window, is woken."""
    worked_at = {k: v for k, v in state.worked_at.items() if k != key}
    state = state.replace(worked_at=worked_at, full_at={**state.full_at, key: now})
    return state, Wake(frozenset({_TOPIC_OF_WINDOW[key]}))


def _want(state: State, kinds: frozenset[str]) -> State:
    return state if kinds <= state.wanted else state.replace(wanted=state.wanted | kinds)


def _kinds_of(topics: frozenset[str]) -> frozenset[str]:
    """What a nudge of ``topics`` asks for: a claim from the queues of the workers it wakes."""
    if not topics:
        return frozenset((WORKFLOW, ACTIVITY))
    return frozenset(_KIND_OF_TOPIC[t] for t in topics if t in _KIND_OF_TOPIC)


# -- the transitions -----------------------------------------------------------------------------
def _nudged(settings: Settings, state: State, event: Nudged) -> Step:
    state, topics = _want(state, _kinds_of(event.topics)), event.topics
    if SCHEDULER in topics and window_left(settings, state, SCHEDULER, event.now) > 0:
        topics = topics - {SCHEDULER}  # it runs when its window ends anyway: a wake only puts it back to sleep
    return state, ((Wake(topics),) if topics or not event.topics else _NOTHING)  # (no topics: every thread)


def _queues_changed(settings: Settings, state: State, event: QueuesChanged) -> Step:
    return _want(state, frozenset((WORKFLOW, ACTIVITY, SCHEDULE_ACTIVITIES))), (Wake(_EVERY_TOPIC),)


def _flushed(settings: Settings, state: State, event: Flushed) -> Step:
    # wake whoever has work the flush made due and did not claim for us; the leader's
    # scheduler also catches, within its poll interval, what a completion could not schedule
    # itself (its dispatch found the scheduler's lock taken)
    left = event.left
    if SCHEDULING in left or ACTIVITY in left:
        state = _want(state, frozenset((SCHEDULE_ACTIVITIES,)))
    topics = frozenset(topic for kind, topic in _LEFT_TO_TOPIC if kind in left)
    commands: tuple[Command, ...] = _NOTHING
    if topics:
        state = _want(state, _kinds_of(topics))
        commands = (Wake(topics),)
    if ACTIVITY in left and not state.backlog:
        state = state.replace(backlog=True)
    return state, commands


def _task_written(settings: Settings, state: State, event: TaskWritten) -> Step:
    if window_left(settings, state, SCHEDULER, event.now) <= 0:
        return state, _NOTHING
    # under load, a task written is a task gone from its queue, and room for the next: the
    # scheduler fills it now, not at the end of its window (which would cap a queue at its
    # capacity once per window)
    state, wake = _full(state, SCHEDULER, event.now)
    return state, (wake,)


def _scheduler_turn(settings: Settings, state: State, event: SchedulerTurn) -> Step:
    if state.stopping:
        return state, (Pause(settings.poll_interval),)
    left = window_left(settings, state, SCHEDULER, event.now)
    if left > 0:  # under load: what arrives meanwhile joins the round
        return state, (Pause(left),)
    return state, (RunScheduler(),)


def _leading(settings: Settings, state: State, event: Leading) -> Step:
    # starts, events and transitions (most nudges) never make activity tasks due: the activity
    # scheduler runs when a flush or a queue change asks, and once per interval (retries coming
    # due, work of other processes)
    asked = SCHEDULE_ACTIVITIES in state.wanted
    if not asked and event.now - state.activities_scheduled_at < settings.poll_interval:
        return state, _NOTHING
    state = state.replace(wanted=state.wanted - {SCHEDULE_ACTIVITIES}, activities_scheduled_at=event.now)
    return state, (ScheduleActivities(),)


def _scheduled(settings: Settings, state: State, event: Scheduled) -> Step:
    commands: list[Command] = []
    if event.workflow_tasks + event.activity_tasks:
        state = _worked(state, SCHEDULER, event.started)
    if event.workflow_tasks >= settings.workflow_batch:
        state, _wake = _full(state, SCHEDULER, event.now)  # its own thread: it comes straight back
    if event.now - state.depths_at >= DEPTHS_EVERY:
        state = state.replace(depths_at=event.now)
        commands.append(ReportDepths())
    if event.workflow_tasks:
        # the round's tasks are a batch already: the worker claims them at once, not after its
        # own window (which would only add latency, not batch more)
        state, wake = _full(state, WORKFLOW, event.now)
        state = _want(state, frozenset((WORKFLOW,)))
        commands.append(wake)
    if event.activity_tasks:
        state = _want(state, frozenset((ACTIVITY,)))
        commands.append(Wake(frozenset((ACTIVITIES,))))
    return state, tuple(commands)


def _claim_turn(settings: Settings, state: State, event: ClaimTurn) -> Step:
    """Claim when nudged (someone made work due) or once per poll interval (work made due
    elsewhere); work handed over needs no claim. Under load a claim waits for the rest of its
    batch window."""
    kind, now = event.kind, event.now
    if state.stopping:
        return state, _NOTHING
    if kind not in state.wanted and now - state.claimed_at.get(kind, float("-inf")) < settings.poll_interval:
        return state, _NOTHING
    left = window_left(settings, state, kind, now)
    if left > 0:
        return state, (Pause(left),)
    state = state.replace(wanted=state.wanted - {kind}, claimed_at={**state.claimed_at, kind: now})
    if kind == WORKFLOW:
        return state, (Claim(WORKFLOW),)
    state, granted = _reserve(settings, state)
    if not granted:
        return state.replace(backlog=True), _NOTHING  # claim again as soon as a slot is free
    return state, (Claim(ACTIVITY, granted),)


def _reserve(settings: Settings, state: State) -> tuple[State, int]:
    if state.stopping or not settings.runs_activities:
        return state, 0
    granted = max(0, min(settings.activity_batch, settings.activity_capacity - state.used))
    if not granted:
        return state, 0
    return state.replace(used=state.used + granted), granted


def _workflow_round(settings: Settings, state: State, event: WorkflowRound) -> Step:
    if not event.claimed:
        return state, _NOTHING
    if event.worked:
        state = _worked(state, WORKFLOW, event.started)
    if not event.full:
        return state, _NOTHING
    state, _wake = _full(state, WORKFLOW, event.now)  # its own thread: it comes straight back
    return _want(state, frozenset((WORKFLOW,))), _NOTHING  # and claims again


def _reserve_activities(settings: Settings, state: State, event: ReserveActivities) -> Step:
    state, granted = _reserve(settings, state)
    return state, ((Claim(ACTIVITY, granted),) if granted else _NOTHING)


def _activities_claimed(settings: Settings, state: State, event: ActivitiesClaimed) -> Step:
    tasks = event.tasks
    running = dict(state.running)
    for task in tasks:
        running[attempt_key(task)] = task
    state = state.replace(used=state.used - (event.limit - len(tasks)), running=running)
    commands: list[Command] = [RunAttempt(task) for task in tasks]
    if event.started is not None:  # the activity poller's own claim
        backlog = len(tasks) == event.limit  # a full claim: there may be more
        state = state.replace(backlog=backlog)
        if tasks:
            state = _worked(state, ACTIVITY, event.started)
        if backlog:
            # the next claim runs as soon as a slot is free (_attempt_ended), not after a window
            state, _wake = _full(state, ACTIVITY, event.now)
    return state, tuple(commands)


def _attempt_ended(settings: Settings, state: State, event: AttemptEnded) -> Step:
    if event.key not in state.running:
        return state, _NOTHING
    running = {key: task for key, task in state.running.items() if key != event.key}
    state = state.replace(running=running, used=state.used - 1)
    if not state.backlog:
        return state, _NOTHING
    # a slot came free and work may be waiting for one
    return _want(state, frozenset((ACTIVITY,))), (Wake(frozenset((ACTIVITIES,))),)


def _stop_requested(settings: Settings, state: State, event: StopRequested) -> Step:
    return state.replace(stopping=True), (Wake(_EVERY_TOPIC),)


_TRANSITIONS: dict[type[Any], Callable[[Settings, State, Any], Step]] = {
    Nudged: _nudged,
    QueuesChanged: _queues_changed,
    Flushed: _flushed,
    TaskWritten: _task_written,
    SchedulerTurn: _scheduler_turn,
    Leading: _leading,
    Scheduled: _scheduled,
    ClaimTurn: _claim_turn,
    WorkflowRound: _workflow_round,
    ReserveActivities: _reserve_activities,
    ActivitiesClaimed: _activities_claimed,
    AttemptEnded: _attempt_ended,
    StopRequested: _stop_requested,
}


def transition(settings: Settings, state: State, event: Event) -> Step:
    """The next state and the commands to carry out, for ``event`` in ``state``: pure."""
    return _TRANSITIONS[type(event)](settings, state, event)


class Coordinator:
    """Holds a started engine's :class:`State` and applies events to it, one at a time.

    ``wake(topics)`` and ``run(task)`` carry out the commands that are the coordinator's own;
    ``handle`` returns the others to the caller. ``observe`` (the simulator's trace, tests) sees
    every event with the commands it produced."""

    def __init__(
        self,
        settings: Settings,
        *,
        wake: Callable[[frozenset[str]], None],
        run: Callable[[ActivityTask], None],
        observe: Callable[[Event, tuple[Command, ...]], None] | None = None,
    ) -> None:
        self._settings = settings
        self.state = State()
        self._wake, self._run = wake, run
        self._observe = observe
        # every engine thread (rounds, flushers, attempts ending, application calls) hands events
        # in: one transition at a time, so that each sees the state the last one left; held
        # only for the pure transition, never while a command is carried out
        self._lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        """The options its transitions read (given at construction)."""
        return self._settings

    def reset(self) -> None:
        """A fresh state (the engine starts again)."""
        with self._lock:
            self.state = State()

    def handle(self, event: Event) -> list[Command]:
        """Apply ``event``; carry out its wakes and runs; return the other commands."""
        with self._lock:
            self.state, commands = transition(self._settings, self.state, event)
        if self._observe is not None:
            self._observe(event, commands)
        rest: list[Command] = []
        for command in commands:
            if type(command) is Wake:
                self._wake(command.topics)
            elif type(command) is RunAttempt:
                self._run(command.task)
            else:
                rest.append(command)
        return rest
