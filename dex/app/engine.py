"""The engine facade (SPEC §5): start, signal, inspect and wait for runs; run the workers."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from dex.app.aio import AsyncEngineMixin
from dex.app.buffer import ACTIVITY_LANE, SCHEDULING, WORKFLOW_LANE, ResultBuffer
from dex.app.clock import VirtualClock
from dex.app.dispatch import ActivitySlots, LocalDispatch
from dex.app.ids import new_run_id
from dex.app.info import RunInfo
from dex.app.inline import InlineActivities, QueueView
from dex.app.leases import validate_activity_lease
from dex.app.ports import (
    ACTIVITY,
    DEFAULT_ACTIVITY_LEASE,
    QUEUE_KINDS,
    WORKFLOW,
    ActivityTask,
    QueueInfo,
    RunFilter,
    Store,
    WorkflowTask,
)
from dex.app.reads import RunReads, aware_datetime
from dex.app.registry import Registry
from dex.app.runner import BatchWindow, Foreground, Nudge, PollingThread, activity_pool
from dex.app.scheduling import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.telemetry import TelemetryHub
from dex.app.tracing import NoTracing, Tracing
from dex.app.watchdog import Watchdog
from dex.app.workers import ActivityWorker, AsyncRunner, WorkflowWorker
from dex.domain import events as ev
from dex.domain.definitions import (
    PayloadConverter,
    validate_key,
    validate_name,
    validate_optional_text,
    validate_priority,
    validate_queue,
    validate_text,
)
from dex.domain.errors import InvalidStateError, SerializationError
from dex.domain.replay import normalize_labels
from dex.domain.status import RunStatus
from dex.domain.task import WorkflowTaskResult
from dex.serialization.payloads import PayloadConverter as DefaultPayloadConverter

log = logging.getLogger("dex.engine")

# the topics of the engine's wake-up calls (runner.Nudge)
SCHEDULER, WORKFLOWS, ACTIVITIES, FLUSHER = "scheduler", "workflows", "activities", "flusher"


class Engine(AsyncEngineMixin):
    """Runs the registered workflows and activities over one store (an adapter)."""

    def __init__(
        self,
        adapter: Store,
        workflows: Iterable[Callable[..., Any]] = (),
        activities: Iterable[Callable[..., Any]] = (),
        *,
        node_id: str | None = None,
        converter: PayloadConverter | None = None,
        max_payload_size: int | None = None,
        activity_concurrency: int = 16,
        poll_interval: float = 0.05,
        workflow_task_lease: timedelta = timedelta(seconds=10),
        activity_lease: timedelta = DEFAULT_ACTIVITY_LEASE,
        leader_lease: timedelta = timedelta(seconds=15),
        retention: timedelta = timedelta(days=7),
        rng: random.Random | None = None,
        executor_cache_size: int = 1000,
        tracing: Tracing | None = None,
        inline_activity_seconds: float = 0.005,
        batch_window: float = 0.05,
        workflow_task_deadline: float = 5.0,
    ) -> None:
        self.store = adapter
        self.registry = Registry(workflows, activities)
        self.node_id = validate_text(node_id, "node_id") if node_id else f"node-{uuid.uuid4()}"
        if converter is not None and max_payload_size is not None:
            raise ValueError("pass max_payload_size to your converter, not to the engine")
        self.converter: PayloadConverter = converter or (
            DefaultPayloadConverter()
            if max_payload_size is None
            else DefaultPayloadConverter(max_payload_size=max_payload_size)
        )
        self._reads = RunReads(adapter, self.registry, self.converter)
        self._rng = rng or random.Random()
        self._activity_concurrency = activity_concurrency
        self._poll_interval = poll_interval
        self._nudge = Nudge()
        self.telemetry = TelemetryHub()
        self.tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._depths_reported_at = 0.0
        # activity tasks are claimed under this short lease (at most their lock_timeout), which
        # the activity thread keeps extending while their attempts run (dex/app/leases.py)
        activity_lease = validate_activity_lease(activity_lease)
        self.buffer = ResultBuffer(
            adapter,
            on_flush=self._flushed,
            on_written=self._workflow_written,
            telemetry=self.telemetry,
            activity_lease=activity_lease,
        )
        self._async = AsyncRunner()
        self.leader = LeaderElection(adapter, self.node_id, ttl=leader_lease, telemetry=self.telemetry)
        self.workflow_scheduler = WorkflowTaskScheduler(adapter)
        self.activity_scheduler = ActivityTaskScheduler(adapter)
        self.maintenance = RetentionMaintenance(adapter, retention=retention)
        self.workflow_worker = WorkflowWorker(
            adapter,
            self.registry,
            self.converter,
            self.buffer,
            self.node_id,
            lease=workflow_task_lease,
            cache_size=executor_cache_size,
            telemetry=self.telemetry,
            tracing=self.tracing,
        )
        self.buffer.give_back = self.workflow_worker.retry_later  # a result the store refuses outright
        # the application's calls (start, send, transitions) go first: see runner.Foreground
        self.foreground = Foreground()
        self.workflow_worker.foreground = self.foreground
        self.activity_worker = ActivityWorker(
            adapter,
            self.registry,
            self.converter,
            self.buffer,
            self.node_id,
            rng=self._rng,
            async_runner=self._async,
            telemetry=self.telemetry,
            tracing=self.tracing,
            lease=activity_lease,
        )
        self._drain_lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[PollingThread] = []
        self._pool: ThreadPoolExecutor | None = None
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
        if isinstance(inline_activity_seconds, bool) or not isinstance(inline_activity_seconds, (int, float)):
            raise TypeError(f"inline_activity_seconds must be a number, got {inline_activity_seconds!r}")
        if inline_activity_seconds < 0:
            raise ValueError(f"inline_activity_seconds must not be negative, got {inline_activity_seconds!r}")
        self._inline_seconds = float(inline_activity_seconds)
        if isinstance(batch_window, bool) or not isinstance(batch_window, (int, float)) or batch_window < 0:
            raise ValueError(f"batch_window must be a number of seconds >= 0, got {batch_window!r}")
        self._window = BatchWindow(float(batch_window))
        if isinstance(workflow_task_deadline, bool) or not isinstance(workflow_task_deadline, (int, float)):
            raise TypeError(f"workflow_task_deadline must be a number of seconds, got {workflow_task_deadline!r}")
        if not workflow_task_deadline > 0:
            raise ValueError(f"workflow_task_deadline must be > 0 seconds, got {workflow_task_deadline!r}")
        self._deadline = float(workflow_task_deadline)  # see dex.app.watchdog
        self._queue_view = QueueView(adapter.list_queues)
        for definition in self.registry.workflows.values():
            adapter.ensure_queue(definition.queue, "workflow")
        for activity in self.registry.activities.values():
            adapter.ensure_queue(activity.queue, "activity")

    def _flushed(self, left: frozenset[str]) -> None:
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
        self._reads.flushed()  # wakes wait(): a run of ours may have just ended

    def _workflow_written(self, task: WorkflowTask, result: WorkflowTaskResult, applied: bool) -> None:
        if applied and self._window.left(SCHEDULER) > 0:
            # under load, a task written is a task gone from its queue, and room for the next:
            # the scheduler fills it now, not at the end of its window (which would cap a queue
            # at its capacity once per window); once per flush, as full() ends the window
            self._window.full(SCHEDULER)
        if applied and result.completion is not None:
            self._reads.written(task.run_id, task.workflow_name, result.completion)
        self.workflow_worker.written(task, applied)

    # -- runs ---------------------------------------------------------------------------------
    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Create a run and return its id (or the id of the live run with this ``instance_id``)."""
        if isinstance(fn_or_name, str):
            validate_name(fn_or_name, "workflow name")  # a name no workflow can have: say why
        definition = self.registry.workflow(fn_or_name)
        definition.signature.check_arity(len(args), f"workflow {definition.name!r}")
        # a NUL would be cut off by libpq (two ids colliding) or fail a write: refused here
        instance_id = validate_key(instance_id, "instance_id")
        concurrency_key = validate_key(concurrency_key, "concurrency_key")
        queue_name = validate_queue(queue) if queue is not None else definition.queue
        payloads = self._encode_all(args)
        with self.tracing.start_run(definition.name, {"dex.workflow": definition.name}) as trace_context:
            created = ev.RunCreated(
                workflow_name=definition.name,
                input=payloads,
                queue=queue_name,
                instance_id=instance_id,
                priority=validate_priority(priority),
                concurrency_key=concurrency_key,
                labels=normalize_labels(labels),
                random_seed=self._rng.getrandbits(64),
                trace_context=trace_context,
            )
            with self.foreground.calling():
                run_id = self._create_run(created)
        self._reads.started(run_id)
        return run_id

    def _create_run(self, created: ev.RunCreated) -> str:
        """Create the run; on a started engine, claim its first workflow task at once if it may
        be scheduled straight away (else the scheduler creates it, and wakes a worker)."""
        dispatch = self.buffer.dispatch if self.buffer.background else None
        claim = dispatch.start_claim() if dispatch is not None else None
        if dispatch is None or claim is None:
            run_id = self.store.create_run(new_run_id(), created, self.store.clock.now())
            self._nudge(SCHEDULER)
            return run_id
        now = self.store.clock.now()
        run_id, claimed, loaded = self.store.create_run_then_claim(new_run_id(), created, now, claim)
        if claimed:
            self.telemetry.tasks_claimed("workflow", len(claimed))
            dispatch.workflows_claimed(claimed, loaded, now)
        else:
            self._nudge(SCHEDULER)
        return run_id

    def _encode_all(self, args: Iterable[Any]) -> tuple[Any, ...]:
        payloads = []
        for index, arg in enumerate(args):
            try:
                payloads.append(self.converter.encode(arg))
            except SerializationError as exc:
                raise SerializationError(f"argument {index}: {exc}") from exc
        return tuple(payloads)

    def send_event(self, run_id: str, event_id: str, payload: Any = None) -> None:
        """Deliver an external event to a run; it is buffered until the run waits for it."""
        run_id = _run_id(run_id)
        validate_name(event_id, "event id")
        message = ev.ExternalEventReceived(event_id=event_id, payload=self.converter.encode(payload))
        with self.foreground.calling():
            self.buffer.send_message(run_id, message)
        self._nudge(SCHEDULER)  # the scheduler makes the workflow task; it wakes the worker

    def cancel(self, run_id: str, reason: str = "") -> None:
        """Ask a run to stop at its next await and end CANCELLED."""
        message = ev.RunCancelled(reason=validate_text(reason, "reason"))
        self._transition(_run_id(run_id), RunStatus.CANCELLED, message)

    def suspend(self, run_id: str) -> None:
        """Hold back a running run's new events until ``resume``."""
        self._transition(_run_id(run_id), RunStatus.SUSPENDED, ev.RunSuspended())

    def resume(self, run_id: str) -> None:
        """Release a suspended run's held events, in order."""
        self._transition(_run_id(run_id), RunStatus.RUNNING, ev.RunResumed())

    def _transition(self, run_id: str, target: RunStatus, message: ev.Message) -> None:
        with self.foreground.calling():
            self.store.request_transition(run_id, target, message, self.store.clock.now())
        self._nudge(SCHEDULER)  # the scheduler makes the workflow task; it wakes the worker

    def get_run(self, run_id: str) -> RunInfo:
        return self._reads.get_run(_run_id(run_id))

    def list_runs(
        self,
        *,
        workflow_name: str | None = None,
        statuses: Iterable[RunStatus | str] | None = None,
        labels: Mapping[str, str] | None = None,
        instance_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Runs matching every given filter, newest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        run_filter = RunFilter(
            workflow_name=validate_optional_text(workflow_name, "workflow_name"),
            statuses=frozenset(RunStatus(s) for s in statuses) if statuses is not None else None,
            labels=normalize_labels(labels),
            instance_id=validate_optional_text(instance_id, "instance_id"),
            created_after=aware_datetime(created_after, "created_after"),
            created_before=aware_datetime(created_before, "created_before"),
            limit=limit,
        )
        return self._reads.list_runs(run_filter)

    def history(self, run_id: str) -> list[ev.HistoryEvent]:
        """The run's history events, oldest first."""
        return self.store.load_history(_run_id(run_id))

    def export_history(self, run_id: str) -> bytes:
        """The run's history as a protobuf ``WorkflowHistory`` (``dex.testing.load_history`` reads it)."""
        return self._reads.export_history(_run_id(run_id))

    def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Block until the run ends; return its result or raise its failure."""
        return self._reads.wait(_run_id(run_id), timeout)

    # -- running ------------------------------------------------------------------------------
    def drain(self, advance_time: bool = True) -> None:
        """Run everything due in this thread until nothing is left.

        With ``advance_time`` and a VirtualClock, jump the clock to the next timer, retry or
        lease expiry and go on. This is the tool for deterministic tests.
        """
        with self._drain_lock:
            while True:
                if self._drain_round():
                    continue
                clock = self.store.clock
                if not advance_time or not isinstance(clock, VirtualClock):
                    return
                due = self.store.next_due_time(clock.now())
                if due is None:
                    return
                clock.advance_to(due)

    def _drain_round(self) -> bool:
        # drain schedules whether or not this node leads: it is the caller's explicit request
        # to run everything due, and scheduling is atomic in every store
        worked = self.workflow_scheduler.step()
        worked += self.activity_scheduler.step()
        worked += self.workflow_worker.poll_once()
        worked += self.buffer.flush()
        worked += self.activity_worker.poll_once()
        worked += self.buffer.flush()
        return worked > 0

    def start(self, metrics_port: int | None = None, metrics_addr: str = "127.0.0.1") -> None:
        """Start background workers, schedulers, leader election and maintenance.

        ``metrics_port`` also serves Prometheus metrics on ``metrics_addr:metrics_port``
        (needs the ``metrics`` extra); see ``dex.observability.prometheus`` to mount them
        in your own application instead.
        """
        if self._threads:
            raise InvalidStateError("the engine is already started")
        if metrics_port is not None:
            from dex.observability.prometheus import PrometheusTelemetry

            prometheus = next((s for s in self.telemetry.sinks if isinstance(s, PrometheusTelemetry)), None)
            if prometheus is None:
                prometheus = PrometheusTelemetry()
                self.telemetry.attach(prometheus)
            prometheus.serve(metrics_port, metrics_addr)
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
            idle_after=self._window.seconds,
        )
        self.buffer.background = True
        if self._inline_seconds > 0:
            self.workflow_worker.inline = InlineActivities(
                self.activity_worker, self._queue_view, self.node_id, self._inline_seconds, self._stopping
            )
        # before the threads start: the first task may be claimed at once
        watchdog = Watchdog(
            self.workflow_worker, self._threads, self._stopping, deadline=self._deadline, telemetry=self.telemetry
        )
        self.workflow_worker.watchdog = watchdog
        loops: list[tuple[str, Callable[[], int], threading.Event]] = [
            ("dex-scheduler", self._schedule_round, self._nudge.channel(SCHEDULER)),
            ("dex-workflow-worker", self._workflow_round, wake_workflows),
            ("dex-activity-worker", self._activity_round, self._wake_activities),
            ("dex-flusher-activities", self._flush_activities, self._nudge.channel(FLUSHER)),
            ("dex-flusher-workflows", self._flush_workflows, self._nudge.channel(FLUSHER)),
        ]
        for name, step, wake in loops:
            # the workflow worker's pauses for the application's calls are tens of microseconds
            fine = step == self._workflow_round
            thread = PollingThread(name, step, wake, self._stopping, interval=self._poll_interval, fine_timers=fine)
            self._threads.append(thread)
            thread.start()
        tick = max(0.01, min(0.25, self._deadline / 5))
        self._threads.append(PollingThread("dex-watchdog", watchdog.step, threading.Event(), self._stopping, interval=tick))
        self._threads[-1].start()

    def health(self) -> dict[str, bool]:
        """Each thread of a started engine, by name: alive (True) or dead (False); empty when
        not started. A dead polling thread is logged and replaced (``dex.app.watchdog``)."""
        threads = {thread.name: thread.alive for thread in list(self._threads)}
        if threads:
            threads["dex-async-activities"] = self._async.alive
        return threads

    def _schedule_round(self) -> int:
        if self._window.wait(SCHEDULER, self._stopping):  # under load: what arrives meanwhile joins
            return 0
        started = self._window.now()
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
            self._window.worked(SCHEDULER, started)
        if workflow_tasks >= self.workflow_scheduler.batch_size:
            self._window.full(SCHEDULER)
        self.maintenance.step()
        if self.telemetry and time.monotonic() - self._depths_reported_at >= 5:
            self._depths_reported_at = time.monotonic()
            self.telemetry.queue_depths(self.store.list_queues())
        if workflow_tasks:
            # the round's tasks are a batch already: the worker claims them at once, not after
            # its own window (which would only add latency, not batch more)
            self._window.full(WORKFLOW)
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
        if self._window.wait(kind, self._stopping):
            return False
        wanted.clear()
        self._claimed_at[kind] = time.monotonic()
        return True

    def _workflow_round(self) -> int:
        claim = self._claim_due(WORKFLOW, self._claim_workflows)
        started = self._window.now()
        worked = self.workflow_worker.poll_once(claim=claim)
        if claim and worked:
            self._window.worked(WORKFLOW, started)
        if claim and self.workflow_worker.claimed_full:
            self._window.full(WORKFLOW)
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
        started = self._window.now()
        try:
            tasks = self.activity_worker.claim(claim.limit)
        finally:
            dispatch.activities_claimed(claim, tasks)  # runs them, frees the unused slots
        self._activity_backlog = len(tasks) == claim.limit  # a full claim: there may be more
        if tasks:
            self._window.worked(ACTIVITY, started)
        if self._activity_backlog:
            self._window.full(ACTIVITY)
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
        """Stop polling, let in-flight tasks finish, flush buffers, release leadership.

        Returns within ``timeout`` seconds plus one flush (SPEC §8): activity attempts still
        running then are abandoned to their leases (whatever they report later is dropped,
        and another worker runs them again once their leases lapse); what was buffered is
        written, so nothing acknowledged is lost.
        """
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self._window.release()
        self._nudge()
        self.buffer.wake()
        for thread in self._threads:
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
        stuck = [thread for thread in self._threads if thread.alive and not thread.retired]
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
            self._threads.clear()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- queues ------------------------------------------------------------------------------
    def create_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        self.store.create_queue(name, _kind(kind), capacity)
        self._queue_view.invalidate()

    def pause_queue(self, name: str, kind: str) -> None:
        self.store.set_queue_paused(name, _kind(kind), True)
        self._queue_view.invalidate()

    def resume_queue(self, name: str, kind: str) -> None:
        self.store.set_queue_paused(name, _kind(kind), False)
        self._queue_view.invalidate()
        self._schedule_activities.set()
        self._nudge()

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        self.store.set_queue_capacity(name, _kind(kind), capacity)
        self._queue_view.invalidate()
        self._schedule_activities.set()
        self._nudge()

    def list_queues(self) -> list[QueueInfo]:
        return self.store.list_queues()


_LEFT_TO_TOPIC = ((WORKFLOW, WORKFLOWS), (ACTIVITY, ACTIVITIES), (SCHEDULING, SCHEDULER))


def _run_id(run_id: object) -> str:
    """A run id as the calls take it: a str (``start_workflow`` returns one), storable as text."""
    if isinstance(run_id, uuid.UUID):
        raise TypeError(f"run_id must be a str, got the UUID {run_id}: pass str(run_id)")
    return validate_text(run_id, "run_id")


def _kind(kind: str) -> str:
    if kind not in QUEUE_KINDS:
        raise ValueError(f"queue kind must be 'workflow' or 'activity', got {kind!r}")
    return kind
