"""The rounds of a started engine: the I/O each of its threads does, one round per call.

A round asks the coordinator (:mod:`dex.app.runtime.coordinator`) what to do, does that I/O — a
scheduler round, a claim, running a batch of workflow tasks, a flush — and tells the
coordinator what came of it. It never blocks waiting for work: it returns how long its thread
may sleep before the next round (0: at once; a wake-up call ends the sleep early). So the same
rounds run on the engine's threads (:mod:`dex.app.runtime.assembly`) and, one at a time in an order a
seed chooses, in the deterministic simulator (:mod:`dex.simulation`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from dex.app.activities.worker import ActivityWorker
from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import ACTIVITY, WORKFLOW, ActivityTask, Claim, Loaded, Store, WorkflowTask
from dex.app.ports.telemetry import TelemetryHub
from dex.app.runtime import coordinator as co
from dex.app.runtime.leader import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.schedules.runner import ScheduleRunner
from dex.app.workflows.worker import NOT_STARTED, Started, WorkflowWorker


def _pause_of(commands: Sequence[co.Command]) -> float | None:
    for command in commands:
        if type(command) is co.Pause:
            return command.seconds
    return None


def _claim_of(commands: Sequence[co.Command]) -> co.Claim | None:
    for command in commands:
        if type(command) is co.Claim:
            return command
    return None


class Rounds:
    """The engine's rounds (module docstring); each returns the seconds its thread may idle."""

    def __init__(
        self,
        coordinator: co.Coordinator,
        *,
        store: Store,
        leader: LeaderElection,
        workflow_scheduler: WorkflowTaskScheduler,
        activity_scheduler: ActivityTaskScheduler,
        maintenance: RetentionMaintenance,
        schedules: ScheduleRunner,
        workflow_worker: WorkflowWorker,
        activity_worker: ActivityWorker,
        buffer: ResultBuffer,
        telemetry: TelemetryHub,
        poll_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        started: Callable[[], Started] = lambda: NOT_STARTED,
        claim_interval: float | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.store, self.leader, self.buffer, self.telemetry = store, leader, buffer, telemetry
        self.workflow_scheduler, self.activity_scheduler = workflow_scheduler, activity_scheduler
        self.maintenance, self.schedules = maintenance, schedules
        self.workflow_worker, self.activity_worker = workflow_worker, activity_worker
        self.poll_interval = poll_interval
        # how long the worker threads idle after a claim that found nothing: the poll interval,
        # or in the event-driven mode (dex.app.runtime.notices) its slow safety poll
        self.claim_interval = poll_interval if claim_interval is None else claim_interval
        self.monotonic = monotonic
        # what the current start lends the workflow rounds (WorkflowWorker.poll_once): asked at
        # each round, since the rounds outlive the starts (NOT_STARTED between them)
        self._started = started

    def scheduler(self) -> float:
        """Leader election, then (leading) the schedulers and retention maintenance."""
        if self.telemetry.sinks:  # a figure the store keeps (its watches change it), for the gauge
            self.telemetry.lost_step_slots(self.store.lost_step_slots)
        handle = self.coordinator.handle
        pause = _pause_of(handle(co.SchedulerTurn(self.monotonic())))
        if pause is not None:
            return pause
        started = self.monotonic()
        if not self.leader.step():
            return self.poll_interval
        workflow_tasks = self.workflow_scheduler.step()
        activity_tasks = 0
        if handle(co.Leading(self.monotonic())):
            activity_tasks = self.activity_scheduler.step()
        report = handle(co.Scheduled(started, self.monotonic(), workflow_tasks, activity_tasks))
        self.maintenance.step()
        self.schedules.step()  # the schedules' fires that are due (the leader's only)
        if report and self.telemetry:
            self.telemetry.queue_depths(self.store.list_queues())
        return 0.0 if workflow_tasks + activity_tasks else self.poll_interval

    def workflows(self) -> float:
        """Run the tasks handed to the workflow worker, and claim more when the queue may hold
        some. A claim that must wait for the rest of its batch window holds the handed tasks
        back too: under load they join the round's batch, whose results one flush writes
        (running them as they came measured 9–30 % fewer workflows/s on a backlog, docs/decisions/batch-window.md)."""
        worker = self.workflow_worker
        commands = self.coordinator.handle(co.ClaimTurn(WORKFLOW, self.monotonic()))
        claim = _claim_of(commands) is not None
        pause = _pause_of(commands)
        if pause is not None:
            return pause
        started = self.monotonic()
        worked = worker.poll_once(claim=claim, started=self._started())
        self.coordinator.handle(
            co.WorkflowRound(started, self.monotonic(), claim, worked, claim and worker.claimed_full)
        )
        return 0.0 if worked else self.claim_interval

    def activities(self) -> float:
        """Keep the running attempts' leases; claim activity tasks for the free slots."""
        self.activity_worker.keep_leases()  # every round
        commands = self.coordinator.handle(co.ClaimTurn(ACTIVITY, self.monotonic()))
        claim = _claim_of(commands)
        if claim is None:
            pause = _pause_of(commands)
            return pause if pause is not None else self.claim_interval
        tasks: list[ActivityTask] = []
        started = self.monotonic()
        try:
            tasks = self.activity_worker.claim(claim.limit)
        finally:  # runs them, and frees the unused slots (all of them when the claim failed)
            self.coordinator.handle(co.ActivitiesClaimed(claim.limit, tuple(tasks), started, self.monotonic()))
        return 0.0 if tasks else self.claim_interval

    def flush(self, lane: str) -> float:
        """Write what ``lane`` of the buffer holds (its thread then waits for more)."""
        self.buffer.flush(lane)
        return self.poll_interval

    def drain(self) -> bool:
        """One round of every component in the caller's thread, as ``Engine.drain`` runs them:
        whether anything progressed (a run held for code that no longer matches is no progress).

        Drain schedules whether or not this node leads: it is the caller's explicit request to run
        everything due, and scheduling is atomic in every store."""
        worked = self.workflow_scheduler.step()
        worked += self.activity_scheduler.step()
        holds = self.workflow_worker.holds
        worked += self.workflow_worker.poll_once() - (self.workflow_worker.holds - holds)
        worked += self.buffer.flush()
        worked += self.activity_worker.poll_once()
        worked += self.buffer.flush()
        return worked > 0


class LocalDispatch:
    """Eager dispatch, the engine's side of "complete, then claim" (the buffer's
    :class:`~dex.app.machinery.buffer.Dispatch`): a completion's transaction claims the tasks it makes
    due, and they run in this process at once.

    When a started engine writes a batch of completions, the same transaction may claim the
    activity tasks a workflow task scheduled and the workflow tasks of the runs an activity
    answered. Nothing about the claim is special: the ordinary claim statement (priorities,
    pause, capacity, ``SKIP LOCKED``, a lease), made by the writer. The coordinator reserves
    the activity slots and hands the claimed attempts to the pool; the workflow tasks go to the
    workflow worker. The queues are still polled, for work made due elsewhere.

    ``running`` is set while the engine runs (from ``Runtime.arm`` to the end of its stop): only
    then is the dispatch :meth:`active`."""

    def __init__(
        self,
        coordinator: co.Coordinator,
        activities: ActivityWorker,
        workflows: WorkflowWorker,
        owner: str,
        *,
        wake_workflows: Callable[[], None],
        idle_after: float = 0.0,
        running: threading.Event | None = None,
        handed: Callable[[Sequence[WorkflowTask]], None] | None = None,
    ) -> None:
        self._coordinator, self._activities, self._workflows = coordinator, activities, workflows
        self._owner, self._wake_workflows = owner, wake_workflows
        self._idle_after = idle_after
        self._running = running
        self._handed = handed  # told of the tasks handed to the workflow worker (the simulator counts them)

    def active(self) -> bool:
        return self._running is None or self._running.is_set()

    def activity_claim(self) -> Claim | None:
        granted = _claim_of(self._coordinator.handle(co.ReserveActivities()))
        if granted is None:
            return None
        return Claim(names=self._activities.names, owner=self._owner, limit=granted.limit, lease=self._activities.lease)

    def activities_claimed(self, claim: Claim, tasks: list[ActivityTask]) -> None:
        self._coordinator.handle(co.ActivitiesClaimed(claim.limit, tuple(tasks)))  # runs them

    def workflow_claim(self, run_ids: Sequence[str]) -> Claim | None:
        """The claim an activity outcome makes: with the input of each claimed task loaded in the
        same transaction, from where this engine's cached executor of the run stands."""
        if self._coordinator.state.stopping or not self._workflows.names:
            return None
        room = self._workflows.room()
        if not room:
            return None
        return Claim(
            names=self._workflows.names,
            owner=self._owner,
            limit=room,
            lease=self._workflows.lease,
            after_seqs=self._workflows.cache.positions(run_ids),
        )

    def start_claim(self) -> Claim | None:
        """The claim a started run makes for its first workflow task: only while this engine is
        idle (nothing handed to the workflow worker, no activity running, no workflow task run
        for ``idle_after`` seconds, the batch window). Idle, the claim saves a scheduler round
        and a claim on the way to the run's first step; under load the scheduler's batches cost
        less per run than a claim in every start, each of which the worker would then run and
        write alone (measured: 8 % more workflows/s in the throughput batch without it)."""
        state = self._coordinator.state
        if state.stopping or not self._workflows.names:
            return None
        if self._workflows.backlog() or state.used or self._workflows.idle_for() < self._idle_after:
            return None
        return Claim(names=self._workflows.names, owner=self._owner, limit=1, lease=self._workflows.lease)

    def workflows_claimed(
        self, tasks: list[WorkflowTask], loaded: list[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        if tasks:
            if self._handed is not None:
                self._handed(tasks)
            self._workflows.hand(tasks, loaded, now)
            self._wake_workflows()
