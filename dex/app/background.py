"""The started engine's background work: its polling threads, the round each one runs, and
starting and stopping them (``Engine.start()``, ``Engine.stop()``).

Five threads — scheduler, workflow worker, activity worker, two flushers — plus the activity
pool and a watchdog (:mod:`dex.app.watchdog`). Each thread only calls a round in a loop
(:class:`dex.app.runner.PollingThread`), sleeping when idle and woken early by a nudge when
this process made work; under load a round waits for the rest of its batch window
(:class:`dex.app.runner.BatchWindow`). ``Engine.drain()`` runs the same components' steps
inline instead, without any of this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from dex.app.activity_worker import ActivityWorker
from dex.app.async_activities import AsyncRunner
from dex.app.buffer import ACTIVITY_LANE, SCHEDULING, WORKFLOW_LANE, ResultBuffer
from dex.app.dispatch import ActivitySlots, LocalDispatch
from dex.app.inline import InlineActivities, QueueView
from dex.app.ports import ACTIVITY, WORKFLOW, ActivityTask, Store
from dex.app.runner import ActivityPool, BatchWindow, Nudge, PollingThread, activity_pool
from dex.app.scheduling import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.telemetry import TelemetryHub
from dex.app.watchdog import Watchdog
from dex.app.workflow_worker import WorkflowWorker

log = logging.getLogger("dex.engine")

# the topics of the engine's wake-up calls (runner.Nudge)
SCHEDULER, WORKFLOWS, ACTIVITIES, FLUSHER = "scheduler", "workflows", "activities", "flusher"

_LEFT_TO_TOPIC = ((WORKFLOW, WORKFLOWS), (ACTIVITY, ACTIVITIES), (SCHEDULING, SCHEDULER))


def timing(
    inline_activity_seconds: float, batch_window: float, workflow_task_deadline: float, workflow_task_lease: timedelta
) -> tuple[float, BatchWindow, float]:
    """The engine's timing options, checked: how long an activity may take to run inline, the
    batch window, and the watchdog's deadline for workflow code (``Engine(...)`` arguments)."""
    if isinstance(inline_activity_seconds, bool) or not isinstance(inline_activity_seconds, (int, float)):
        raise TypeError(f"inline_activity_seconds must be a number, got {inline_activity_seconds!r}")
    if inline_activity_seconds < 0:
        raise ValueError(f"inline_activity_seconds must not be negative, got {inline_activity_seconds!r}")
    if isinstance(batch_window, bool) or not isinstance(batch_window, (int, float)) or batch_window < 0:
        raise ValueError(f"batch_window must be a number of seconds >= 0, got {batch_window!r}")
    if isinstance(workflow_task_deadline, bool) or not isinstance(workflow_task_deadline, (int, float)):
        raise TypeError(f"workflow_task_deadline must be a number of seconds, got {workflow_task_deadline!r}")
    if not workflow_task_deadline > 0:
        raise ValueError(f"workflow_task_deadline must be > 0 seconds, got {workflow_task_deadline!r}")
    # see dex.app.watchdog; at most half the task's lease, so that a blocked task is given
    # back before its lease lets another worker redo it
    deadline = min(float(workflow_task_deadline), workflow_task_lease.total_seconds() / 2)
    return float(inline_activity_seconds), BatchWindow(float(batch_window)), deadline


class Background:
    """The threads of a started engine and the rounds they run (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        leader: LeaderElection,
        workflow_scheduler: WorkflowTaskScheduler,
        activity_scheduler: ActivityTaskScheduler,
        maintenance: RetentionMaintenance,
        workflow_worker: WorkflowWorker,
        activity_worker: ActivityWorker,
        buffer: ResultBuffer,
        async_runner: AsyncRunner,
        queue_view: QueueView,
        telemetry: TelemetryHub,
        poll_interval: float,
        activity_concurrency: int,
        inline_seconds: float,
        window: BatchWindow,
        deadline: float,
    ) -> None:
        self.store, self.node_id, self.leader = store, node_id, leader
        self.workflow_scheduler, self.activity_scheduler = workflow_scheduler, activity_scheduler
        self.maintenance, self.buffer, self.telemetry = maintenance, buffer, telemetry
        self.workflow_worker, self.activity_worker = workflow_worker, activity_worker
        activity_worker.completed_directly = self.queues_changed  # a transaction step wrote its completion
        self._async, self._queue_view = async_runner, queue_view
        self._poll_interval = poll_interval
        self._activity_concurrency = activity_concurrency
        self._inline_seconds = inline_seconds
        self._deadline = deadline  # see dex.app.watchdog
        self.window = window
        self._nudge = Nudge()
        self._depths_reported_at = 0.0
        self._stopping = threading.Event()
        self.threads: list[PollingThread] = []
        self._pool: ActivityPool | None = None
        self._slots = ActivitySlots(activity_concurrency)  # attempts reserved or running in the pool
        # the attempts handed to the pool and not yet ended, by (task id, lease version): what a
        # stop that runs out of time abandons
        self._in_pool: dict[tuple[int, int], ActivityTask] = {}
        self._in_pool_lock = threading.Lock()
        self._wake_activities = threading.Event()  # replaced by the activity thread's channel on start
        self._claim_activities = threading.Event()
        self._claim_workflows = threading.Event()
        self._claimed_at: dict[str, float] = {}
        self._activity_backlog = False
        self._schedule_activities = threading.Event()  # a flush or a queue change asks for a round
        self._activities_scheduled_at = float("-inf")

    def nudge(self, *topics: str) -> None:
        """Wake the threads of these topics (all of them, without any) of this start."""
        self._nudge(*topics)

    def queues_changed(self) -> None:
        """A queue takes work again (resumed, or more capacity): schedule activities, wake all."""
        self._schedule_activities.set()
        self._nudge()

    def flushed(self, left: frozenset[str]) -> None:
        # wake whoever has work the flush made due and did not claim for us; the leader's
        # scheduler also catches, within its poll interval, what a completion could not
        # schedule itself (its dispatch found the scheduler's lock taken)
        if SCHEDULING in left or ACTIVITY in left:
            self._schedule_activities.set()
        topics = [topic for kind, topic in _LEFT_TO_TOPIC if kind in left]
        if topics:
            self._nudge(*topics)
        if ACTIVITY in left:
            self._activity_backlog = True

    def task_written(self) -> None:
        """The store applied a workflow task's result."""
        if self.window.left(SCHEDULER) > 0:
            # under load, a task written is a task gone from its queue, and room for the next:
            # the scheduler fills it now, not at the end of its window (which would cap a queue
            # at its capacity once per window); once per flush, as full() ends the window
            self.window.full(SCHEDULER)

    def start(self) -> None:
        """Start the threads (the engine checked that none run)."""
        self._stopping.clear()
        self._pool = activity_pool(self._activity_concurrency)
        self._nudge = Nudge()  # this start's threads only (channels of an earlier start are gone)
        wake_workflows = self._nudge.channel(WORKFLOWS)
        self._wake_activities = self._nudge.channel(ACTIVITIES)
        # set by nudges (not by work handed over): the queues may hold work for us
        self._claim_workflows = self._nudge.channel(WORKFLOWS)
        self._claim_activities = self._nudge.channel(ACTIVITIES)
        self._claimed_at = {WORKFLOW: float("-inf"), ACTIVITY: float("-inf")}
        self.buffer.dispatch = LocalDispatch(
            self.activity_worker,
            self.workflow_worker,
            self._slots,
            self.node_id,
            run_activity=self._run_activity,
            wake_workflows=wake_workflows.set,
            stopping=self._stopping,
            idle_after=self.window.seconds,
        )
        self.buffer.background = True
        if self._inline_seconds > 0:
            self.workflow_worker.inline = InlineActivities(
                self.activity_worker, self._queue_view, self.node_id, self._inline_seconds, self._stopping
            )
        # before the threads start: the first task may be claimed at once
        watchdog = Watchdog(
            self.workflow_worker, self.threads, self._stopping, deadline=self._deadline, telemetry=self.telemetry
        )
        self.workflow_worker.watchdog = watchdog
        loops: list[tuple[str, Callable[[], int], threading.Event]] = [
            ("dex-scheduler", self.schedule_round, self._nudge.channel(SCHEDULER)),
            ("dex-workflow-worker", self._workflow_round, wake_workflows),
            ("dex-activity-worker", self._activity_round, self._wake_activities),
            ("dex-flusher-activities", self._flush_activities, self._nudge.channel(FLUSHER)),
            ("dex-flusher-workflows", self._flush_workflows, self._nudge.channel(FLUSHER)),
        ]
        for name, step, wake in loops:
            # the workflow worker's pauses for the application's calls are tens of microseconds
            fine = step == self._workflow_round
            thread = PollingThread(name, step, wake, self._stopping, interval=self._poll_interval, fine_timers=fine)
            self.threads.append(thread)
            thread.start()
        tick = max(0.01, min(0.25, watchdog.stall / 4))
        self.threads.append(
            PollingThread("dex-watchdog", watchdog.step, threading.Event(), self._stopping, interval=tick)
        )
        self.threads[-1].start()

    def health(self) -> dict[str, bool]:
        """Each thread, by name: alive or dead; empty when not started."""
        threads = {thread.name: thread.alive for thread in list(self.threads)}
        if threads:
            threads["dex-async-activities"] = self._async.alive
        return threads

    def schedule_round(self) -> int:
        if self.window.wait(SCHEDULER, self._stopping):  # under load: what arrives meanwhile joins
            return 0
        started = self.window.now()
        if not self.leader.step():
            return 0
        workflow_tasks = self.workflow_scheduler.step()
        activity_tasks = 0
        # starts, events and transitions (most nudges) never make activity tasks due: the
        # activity scheduler runs when a flush or a queue change asks, and once per interval
        # (retries coming due, work of other processes)
        now = time.monotonic()
        if self._schedule_activities.is_set() or now - self._activities_scheduled_at >= self._poll_interval:
            self._schedule_activities.clear()
            self._activities_scheduled_at = now
            activity_tasks = self.activity_scheduler.step()
        worked = workflow_tasks + activity_tasks
        if worked:
            self.window.worked(SCHEDULER, started)
        if workflow_tasks >= self.workflow_scheduler.batch_size:
            self.window.full(SCHEDULER)
        self.maintenance.step()
        if self.telemetry and time.monotonic() - self._depths_reported_at >= 5:
            self._depths_reported_at = time.monotonic()
            self.telemetry.queue_depths(self.store.list_queues())
        if workflow_tasks:
            # the round's tasks are a batch already: the worker claims them at once, not after
            # its own window (which would only add latency, not batch more)
            self.window.full(WORKFLOW)
            self._nudge(WORKFLOWS)
        if activity_tasks:
            self._nudge(ACTIVITIES)
        return worked

    def _claim_due(self, kind: str, wanted: threading.Event) -> bool:
        """Whether a round should claim from the queue: when nudged (someone made work due) or
        once per poll interval (work made due elsewhere); work handed over needs no claim.
        Under load a claim waits for the rest of the batch window (``BatchWindow``)."""
        now = time.monotonic()
        if not wanted.is_set() and now - self._claimed_at[kind] < self._poll_interval:
            return False
        if self.window.wait(kind, self._stopping):
            return False
        wanted.clear()
        self._claimed_at[kind] = time.monotonic()
        return True

    def _workflow_round(self) -> int:
        claim = self._claim_due(WORKFLOW, self._claim_workflows)
        started = self.window.now()
        worked = self.workflow_worker.poll_once(claim=claim)
        if claim and worked:
            self.window.worked(WORKFLOW, started)
        if claim and self.workflow_worker.claimed_full:
            self.window.full(WORKFLOW)
            self._claim_workflows.set()  # claim again in the next round
        return worked

    def _activity_round(self) -> int:
        self.activity_worker.keep_leases()  # the running attempts' leases, every round
        if not self._claim_due(ACTIVITY, self._claim_activities):
            return 0
        dispatch = self.buffer.dispatch
        claim = dispatch.activity_claim() if dispatch is not None else None  # reserves the slots
        if dispatch is None or claim is None:
            self._activity_backlog = True  # no slot free: claim again as soon as one is
            return 0
        tasks: list[ActivityTask] = []
        started = self.window.now()
        try:
            tasks = self.activity_worker.claim(claim.limit)
        finally:
            dispatch.activities_claimed(claim, tasks)  # runs them, frees the unused slots
        self._activity_backlog = len(tasks) == claim.limit  # a full claim: there may be more
        if tasks:
            self.window.worked(ACTIVITY, started)
        if self._activity_backlog:
            self.window.full(ACTIVITY)
        return len(tasks)

    def _run_activity(self, task: ActivityTask) -> None:
        """Run a claimed attempt in the pool; its slot is reserved already."""
        key = (task.task_id, task.lease.version)
        with self._in_pool_lock:
            self._in_pool[key] = task
        pool = self._pool
        try:
            if pool is None:
                raise RuntimeError("the engine stopped")
            future = pool.submit(self.activity_worker.run, task)
        except BaseException:  # noqa: BLE001 - the pool is shut down (the engine stops): the lease brings it back
            log.info(
                "could not run activity %s of run %s; it is retried when its lease expires",
                task.name,
                task.run_id,
                extra={"run_id": task.run_id, "activity_name": task.name},
            )
            self._activity_done(key)  # its slot is free again
            return
        future.add_done_callback(lambda _f: self._activity_done(key))

    def _activity_done(self, key: tuple[int, int]) -> None:
        with self._in_pool_lock:
            self._in_pool.pop(key, None)
        self._slots.release()
        if self._activity_backlog:  # a slot came free and work may be waiting for one
            self._claim_activities.set()
            self._wake_activities.set()

    def _flush_activities(self) -> int:
        return self._flush_round(ACTIVITY_LANE)

    def _flush_workflows(self) -> int:
        return self._flush_round(WORKFLOW_LANE)

    def _flush_round(self, lane: str) -> int:
        # the buffer's own wait is the flusher's idle wait: report work always, so that the
        # polling thread comes straight back to it instead of sleeping on its wake-up channel
        self.buffer.wait_for_work(self._poll_interval, lane)
        self.buffer.flush(lane)
        return 1

    def stop(self, timeout: float = 30) -> None:
        """Stop the threads and let in-flight tasks finish, flush, release leadership (``Engine.stop``)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self.window.release()
        self._nudge()
        self.buffer.wake()
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._pool is not None:
            # no waiting here: attempts not started yet are cancelled (their leases lapse),
            # the running ones get until the deadline
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            while self._in_pool and time.monotonic() < deadline:
                time.sleep(0.01)
        with self._in_pool_lock:
            abandoned = list(self._in_pool.values())
        if abandoned:
            self.buffer.abandon(abandoned)
            log.warning(
                "stop: %d activity attempt(s) still running after %g s are abandoned to their leases (%s)",
                len(abandoned),
                timeout,
                ", ".join(f"{task.name} of run {task.run_id}" for task in abandoned[:5]),
            )
        self.buffer.background = False
        self.workflow_worker.inline = None
        self.workflow_worker.watchdog = None
        stuck = [thread for thread in self.threads if thread.alive and not thread.retired]
        try:
            if stuck:  # the workflow worker may still be in its round: leave its tasks alone
                log.warning("stop: %d engine thread(s) did not end within %g s", len(stuck), timeout)
            else:
                # tasks a last completion claimed for us after the workflow thread left
                while self.workflow_worker.poll_once(claim=False):
                    pass
            self.buffer.flush()
        except Exception:  # the store is down: what is unwritten comes back when its leases expire
            log.exception("the final flush failed; unwritten results will be redone after their leases expire")
        finally:
            self.workflow_worker.forget()
            try:
                self.leader.release()
            except Exception:  # the lease lapses on its own
                log.warning("could not release leadership; it lapses with its lease", exc_info=True)
            self._async.close(timeout=max(0.2, deadline - time.monotonic()))
            self.threads.clear()
