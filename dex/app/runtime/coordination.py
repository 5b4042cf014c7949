"""The events a started engine's coordinator takes and the commands it gives back
(:mod:`dex.app.runtime.coordinator`): plain frozen values, so that a transition's input and output can
be compared, logged and replayed."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from dex.app.ports.store import ActivityTask

AttemptKey: TypeAlias = tuple[int, int]  # (task id, lease version): one claim of a task


# -- events --------------------------------------------------------------------------------------
@attrs.frozen
class Nudged:
    """This process made work for ``topics`` (all topics when empty) at ``now``: a start, an
    event sent."""

    topics: frozenset[str]
    now: float


@attrs.frozen
class QueuesChanged:
    """A queue takes work again (resumed, or more capacity)."""


@attrs.frozen
class Flushed:
    """The buffer wrote a batch and left this work for others (buffer.EVERYTHING's kinds)."""

    left: frozenset[str]


@attrs.frozen
class TaskWritten:
    """The store applied a workflow task's result: room in its queue for the next."""

    now: float


@attrs.frozen
class SchedulerTurn:
    """The scheduler thread asks whether to run a round now."""

    now: float


@attrs.frozen
class Leading:
    """This engine leads this round: should the activity scheduler run too?"""

    now: float


@attrs.frozen
class Scheduled:
    """A scheduler round that began at ``started`` made these many tasks."""

    started: float
    now: float
    workflow_tasks: int
    activity_tasks: int


@attrs.frozen
class ClaimTurn:
    """A worker thread asks whether to claim from the ``kind`` queue now."""

    kind: str
    now: float


@attrs.frozen
class WorkflowRound:
    """The workflow worker ran a round that began at ``started``."""

    started: float
    now: float
    claimed: bool  # it claimed from the queue (not only handed tasks)
    worked: int
    full: bool  # its claim got as many as it asked for


@attrs.frozen
class ReserveActivities:
    """A completion wants to claim the activity tasks it makes due ("complete, then claim")."""


@attrs.frozen
class ActivitiesClaimed:
    """A claim reserved ``limit`` slots and got ``tasks``; ``started`` for a poller's own claim
    (None for a completion's)."""

    limit: int
    tasks: tuple[ActivityTask, ...]
    started: float | None = None
    now: float = 0.0


@attrs.frozen
class AttemptEnded:
    """An attempt handed to the pool ended, or could not be started."""

    key: AttemptKey


@attrs.frozen
class StopRequested:
    """``Engine.stop()``."""


Event: TypeAlias = (
    Nudged
    | QueuesChanged
    | Flushed
    | TaskWritten
    | SchedulerTurn
    | Leading
    | Scheduled
    | ClaimTurn
    | WorkflowRound
    | ReserveActivities
    | ActivitiesClaimed
    | AttemptEnded
    | StopRequested
)


# -- commands ------------------------------------------------------------------------------------
@attrs.frozen
class Wake:
    """Wake the threads of ``topics`` (every thread when empty)."""

    topics: frozenset[str] = frozenset()


@attrs.frozen
class RunAttempt:
    """Run this claimed attempt in the pool: its slot is reserved."""

    task: ActivityTask


@attrs.frozen
class Pause:
    """The asking round waits up to ``seconds`` (a wake ends it early), then asks again."""

    seconds: float


@attrs.frozen
class Claim:
    """Claim from the ``kind`` queue, at most ``limit`` tasks (0: the worker's own batch)."""

    kind: str
    limit: int = 0


@attrs.frozen
class RunScheduler:
    """Run a scheduler round (leader election first)."""


@attrs.frozen
class ScheduleActivities:
    """The activity scheduler runs in this round too."""


@attrs.frozen
class ReportDepths:
    """Report the queues' depths (telemetry)."""


Command: TypeAlias = Wake | RunAttempt | Pause | Claim | RunScheduler | ScheduleActivities | ReportDepths
