"""Eager dispatch: the tasks a completion claims run in this process at once.

When a started engine writes a batch of completions, the same transaction may claim the
tasks that batch made due ("complete, then claim", :class:`dex.app.ports.Claim`): the
activity tasks a workflow task scheduled, the workflow tasks of the runs an activity
answered. The claimed tasks are handed straight to this engine's activity pool and workflow
worker, so a step of a workflow costs two writes (the workflow task's result, the activity's
outcome) instead of a write, a schedule, a claim and a poll interval each way.

Nothing about the claim is special: it is the ordinary claim statement (priorities, pause,
capacity, ``SKIP LOCKED``, a lease), only made by the writer. The queues are still polled,
for work made due elsewhere (timers, other processes, the scheduler).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from dex.app.activity_worker import ActivityWorker
from dex.app.ports import ActivityTask, Claim, Loaded, WorkflowTask
from dex.app.workflow_worker import WorkflowWorker


class ActivitySlots:
    """The activity pool's room: a slot is reserved before a claim and freed when its attempt ends."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._used = 0
        self._lock = threading.Lock()

    def reserve(self, wanted: int) -> int:
        """Reserve up to ``wanted`` free slots; return how many were reserved."""
        with self._lock:
            granted = max(0, min(wanted, self._capacity - self._used))
            self._used += granted
            return granted

    def release(self, count: int = 1) -> None:
        with self._lock:
            self._used -= count

    @property
    def used(self) -> int:
        return self._used


class LocalDispatch:
    """The engine's side of "complete, then claim" (the buffer's :class:`~dex.app.buffer.Dispatch`)."""

    def __init__(
        self,
        activities: ActivityWorker,
        workflows: WorkflowWorker,
        slots: ActivitySlots,
        owner: str,
        *,
        run_activity: Callable[[ActivityTask], None],
        wake_workflows: Callable[[], None],
        stopping: threading.Event,
        idle_after: float = 0.0,
    ) -> None:
        self._activities, self._workflows, self._slots = activities, workflows, slots
        self._owner, self._run_activity, self._wake_workflows = owner, run_activity, wake_workflows
        self._stopping = stopping
        self._idle_after = idle_after

    def activity_claim(self) -> Claim | None:
        if self._stopping.is_set() or not self._activities.names:
            return None
        reserved = self._slots.reserve(self._activities.batch_size)
        if not reserved:
            return None
        return Claim(names=self._activities.names, owner=self._owner, limit=reserved, lease=self._activities.lease)

    def activities_claimed(self, claim: Claim, tasks: list[ActivityTask]) -> None:
        self._slots.release(claim.limit - len(tasks))
        for task in tasks:
            self._run_activity(task)  # its slot is already reserved

    def workflow_claim(self, run_ids: Sequence[str]) -> Claim | None:
        """The claim an activity outcome makes: with the input of each claimed task loaded in the
        same transaction, from where this engine's cached executor of the run stands."""
        if self._stopping.is_set() or not self._workflows.names:
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
        if self._stopping.is_set() or not self._workflows.names:
            return None
        if self._workflows.backlog() or self._slots.used or self._workflows.idle_for() < self._idle_after:
            return None
        return Claim(names=self._workflows.names, owner=self._owner, limit=1, lease=self._workflows.lease)

    def workflows_claimed(
        self, tasks: list[WorkflowTask], loaded: list[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        if tasks:
            self._workflows.hand(tasks, loaded, now)
            self._wake_workflows()
