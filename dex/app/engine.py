"""The engine facade (SPEC §5): start, signal, inspect and wait for runs; run the workers.
``Engine.drain()`` runs every step inline, in the caller's thread; the threads of a started
engine and the rounds they run are :mod:`dex.app.background`."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from dex.app.activity_worker import ActivityWorker
from dex.app.aio import AsyncEngineMixin
from dex.app.async_activities import AsyncRunner
from dex.app.background import SCHEDULER, Background, timing
from dex.app.buffer import ResultBuffer
from dex.app.fork import ForkEngineMixin
from dex.app.health import EngineHealth
from dex.app.held import holds_runs
from dex.app.ids import new_run_id
from dex.app.info import RunInfo
from dex.app.inline import QueueView
from dex.app.leases import validate_activity_lease
from dex.app.long_polls import LongPollGates, LongPolls
from dex.app.ports import DEFAULT_ACTIVITY_LEASE, AnsweredStep, Store, WorkflowTask
from dex.app.queue_api import QueueEngineMixin
from dex.app.reads import RunReads, run_filter, run_id_of
from dex.app.registry import Registry
from dex.app.runner import Foreground
from dex.app.schedule_api import ScheduleEngineMixin
from dex.app.schedule_spec import Schedule
from dex.app.scheduling import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.starts import StartEngineMixin
from dex.app.telemetry import TelemetryHub
from dex.app.tracing import NoTracing, Tracing
from dex.app.workflow_worker import WorkflowWorker
from dex.domain import events as ev
from dex.domain.definitions import (
    PayloadConverter,
    validate_key,
    validate_name,
    validate_queue,
    validate_text,
)
from dex.domain.errors import InvalidStateError
from dex.domain.status import RunStatus
from dex.domain.task import WorkflowTaskResult
from dex.serialization.payloads import PayloadConverter as DefaultPayloadConverter


class Engine(StartEngineMixin, ScheduleEngineMixin, QueueEngineMixin, ForkEngineMixin, AsyncEngineMixin):
    """Runs the registered workflows and activities over one store (an adapter)."""

    def __init__(
        self,
        adapter: Store,
        workflows: Iterable[Callable[..., Any]] = (),
        activities: Iterable[Callable[..., Any]] = (),
        *,
        schedules: Iterable[Schedule] = (),
        node_id: str | None = None,
        converter: PayloadConverter | None = None,
        max_payload_size: int | None = None,
        activity_concurrency: int = 64,
        poll_interval: float = 0.05,
        workflow_task_lease: timedelta = timedelta(seconds=10),
        activity_lease: timedelta = DEFAULT_ACTIVITY_LEASE,
        leader_lease: timedelta = timedelta(seconds=15),
        retention: timedelta = timedelta(days=7),
        rng: random.Random | None = None,
        executor_cache_size: int = 1000,
        tracing: Tracing | None = None,
        inline_activity_seconds: float = 0.005,
        chained_activity_seconds: float = 0.1,
        batch_window: float = 0.05,
        workflow_task_deadline: float = 5.0,
        code_version: str | None = None,
        on_nondeterminism: str = "hold",
    ) -> None:
        self.store = adapter
        self.registry = Registry(workflows, activities)
        self.node_id = validate_text(node_id, "node_id") if node_id else f"node-{uuid.uuid4()}"
        # names the deployed code in every run this engine starts (SPEC §11)
        self.code_version = validate_key(code_version, "code_version")
        holds_runs_ = holds_runs(on_nondeterminism)  # a run its code does not match: held or failed
        if converter is not None and max_payload_size is not None:
            raise ValueError("pass max_payload_size to your converter, not to the engine")
        self.converter: PayloadConverter = converter or (
            DefaultPayloadConverter()
            if max_payload_size is None
            else DefaultPayloadConverter(max_payload_size=max_payload_size)
        )
        self._reads = RunReads(adapter, self.registry, self.converter)
        self._rng = rng or random.Random()
        self.telemetry = TelemetryHub()
        self._long_polls = LongPollGates(self.telemetry.long_polls)  # remote workers' polls, for health()
        self.tracing: Tracing = tracing if tracing is not None else NoTracing()
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
        self._init_schedules(adapter, schedules, self.code_version)  # SPEC §10; self.schedules is stepped by the leader
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
        self.workflow_worker.holds_runs = holds_runs_
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
        inline = (inline_activity_seconds, chained_activity_seconds)
        inline_seconds, window, deadline = timing(inline, batch_window, workflow_task_deadline, workflow_task_lease)
        self._queue_view = QueueView(adapter.activity_slots)
        # the threads of a started engine (Engine.start) and the rounds they run
        self._background = Background(
            adapter,
            node_id=self.node_id,
            leader=self.leader,
            workflow_scheduler=self.workflow_scheduler,
            activity_scheduler=self.activity_scheduler,
            maintenance=self.maintenance,
            schedules=self.schedules,
            workflow_worker=self.workflow_worker,
            activity_worker=self.activity_worker,
            buffer=self.buffer,
            async_runner=self._async,
            queue_view=self._queue_view,
            telemetry=self.telemetry,
            poll_interval=poll_interval,
            activity_concurrency=activity_concurrency,
            inline_seconds=inline_seconds,
            window=window,
            deadline=deadline,
        )
        for definition in self.registry.workflows.values():
            adapter.ensure_queue(definition.queue, "workflow")
        for activity in self.registry.activities.values():
            adapter.ensure_queue(activity.queue, "activity")

    def _flushed(self, left: frozenset[str]) -> None:
        self._background.flushed(left)  # wakes the threads the flush left work for
        self._reads.flushed()  # wakes wait(): a run of ours may have just ended

    def _workflow_written(self, task: WorkflowTask, result: WorkflowTaskResult, applied: bool) -> None:
        if applied and not isinstance(task, AnsweredStep):
            self._background.task_written()
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
        connection: Any = None,
    ) -> str:
        """Create a run and return its id (or the id of the live run with this ``instance_id``); with
        ``connection`` (a ``psycopg.Connection``), in its transaction, for the caller to commit (SPEC §9)."""
        definition = self.registry.workflow(fn_or_name)  # a name no workflow can have: says why
        definition.signature.check_arity(len(args), f"workflow {definition.name!r}")
        queue = validate_queue(queue) if queue is not None else definition.queue
        return self._start(definition.name, queue, args, instance_id, priority, concurrency_key, labels, connection)

    def _create_run(self, created: ev.RunCreated) -> str:
        """Create the run; on a started engine, claim its first workflow task at once if it may
        be scheduled straight away (else the scheduler creates it, and wakes a worker)."""
        dispatch = self.buffer.dispatch if self.buffer.background else None
        claim = dispatch.start_claim() if dispatch is not None else None
        if dispatch is None or claim is None:
            run_id = self.store.create_run(new_run_id(), created, self.store.clock.now())
            self._background.nudge(SCHEDULER)
            return run_id
        now = self.store.clock.now()
        run_id, claimed, loaded = self.store.create_run_then_claim(new_run_id(), created, now, claim)
        if claimed:
            self.telemetry.tasks_claimed("workflow", len(claimed))
            dispatch.workflows_claimed(claimed, loaded, now)
        else:
            self._background.nudge(SCHEDULER)
        return run_id

    def send_event(self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None) -> None:
        """Deliver an external event to a run; it is buffered until the run waits for it. With
        ``connection``, in that connection's transaction (as ``start_workflow``)."""
        run_id = run_id_of(run_id)
        validate_name(event_id, "event id")
        message = ev.ExternalEventReceived(event_id=event_id, payload=self.converter.encode(payload))
        with self.foreground.calling():
            if connection is not None:
                self.store.send_message_in(connection, run_id, message, self.store.clock.now())
            else:
                self.buffer.send_message(run_id, message)
        self._background.nudge(SCHEDULER)  # the scheduler makes the workflow task; it wakes the worker

    def cancel(self, run_id: str, reason: str = "") -> None:
        """Ask a run to stop at its next await and end CANCELLED."""
        message = ev.RunCancelled(reason=validate_text(reason, "reason"))
        self._transition(run_id_of(run_id), RunStatus.CANCELLED, message)

    def suspend(self, run_id: str) -> None:
        """Hold back a running run's new events until ``resume``."""
        self._transition(run_id_of(run_id), RunStatus.SUSPENDED, ev.RunSuspended())

    def resume(self, run_id: str) -> None:
        """Release a suspended run's held events, in order."""
        self._transition(run_id_of(run_id), RunStatus.RUNNING, ev.RunResumed())

    def _transition(self, run_id: str, target: RunStatus, message: ev.Message) -> None:
        with self.foreground.calling():
            self.store.request_transition(run_id, target, message, self.store.clock.now())
        self._background.nudge(SCHEDULER)  # the scheduler makes the workflow task; it wakes the worker

    def get_run(self, run_id: str) -> RunInfo:
        return self._reads.get_run(run_id_of(run_id))

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
        code_version: str | None = None,
    ) -> list[RunInfo]:
        """Runs matching every given filter, newest first."""
        return self._reads.list_runs(
            run_filter(workflow_name, statuses, labels, instance_id, created_after, created_before, limit, code_version)
        )

    def history(self, run_id: str) -> list[ev.HistoryEvent]:
        """The run's history events, oldest first."""
        return self.store.load_history(run_id_of(run_id))

    def export_history(self, run_id: str) -> bytes:
        """The run's history as a protobuf ``WorkflowHistory`` (``dex.testing.load_history`` reads it)."""
        return self._reads.export_history(run_id_of(run_id))

    def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Block until the run ends; return its result or raise its failure."""
        return self._reads.wait(run_id_of(run_id), timeout)

    # -- running ------------------------------------------------------------------------------
    def drain(self, advance_time: bool = True, until: datetime | timedelta | None = None) -> None:
        """Run everything due in this thread until nothing is left.

        With ``advance_time`` and a VirtualClock, jump the clock to the next timer, retry or
        lease expiry and go on (with ``until``, a datetime or a timedelta from now, to schedule
        fires and then ``until`` too: SPEC §10). This is the tool for deterministic tests.
        A held run (SPEC §11) is retried with its backoff; drain does not wait for it forever:
        after three jumps in a row whose rounds only held runs, it returns.
        """
        with self._drain_lock:
            bound = self._drain_bound(until)
            holding = 0  # rounds in a row that did nothing but hold runs
            while True:
                holds = self.workflow_worker.holds
                if self._drain_round():
                    holding = 0
                    continue
                holding += self.workflow_worker.holds > holds
                if self.schedules.step(bound):
                    continue
                if holding >= 3 or not self._drain_jump(advance_time, bound if until is not None else None):
                    return

    def _drain_round(self) -> bool:
        # drain schedules whether or not this node leads: it is the caller's explicit request
        # to run everything due, and scheduling is atomic in every store
        worked = self.workflow_scheduler.step()
        worked += self.activity_scheduler.step()
        holds = self.workflow_worker.holds
        worked += self.workflow_worker.poll_once() - (self.workflow_worker.holds - holds)  # a hold is no progress
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
        if self._background.threads:
            raise InvalidStateError("the engine is already started")
        if metrics_port is not None:
            from dex.observability.prometheus import PrometheusTelemetry

            prometheus = next((s for s in self.telemetry.sinks if isinstance(s, PrometheusTelemetry)), None)
            if prometheus is None:
                prometheus = PrometheusTelemetry()
                self.telemetry.attach(prometheus)
            prometheus.serve(metrics_port, metrics_addr)
        self._background.start()

    def on_activity_work(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (quick, never raising) when this engine makes activity tasks due."""
        self._background.activity_listeners.append(listener)

    def long_poll_gate(self, limit: int) -> LongPolls:
        """A gate of ``limit`` long polls for a remote-worker service over this engine
        (``dex.remote.ActivityTaskService``), counted in :meth:`health` and the metrics."""
        return self._long_polls.gate(limit)

    def health(self) -> EngineHealth:
        """The started engine's threads (by name: alive or dead; empty when not started; a dead
        polling thread is logged and replaced, ``dex.app.watchdog``) and what hostile code or
        clients hold: see :class:`dex.app.health.EngineHealth`."""
        long_polls_open, long_polls_limit = self._long_polls.figures()
        return EngineHealth(
            threads=self._background.health(),
            abandoned_executors=self.workflow_worker.closer.abandoned,
            interrupted_threads=self.workflow_worker.quarantine.interrupted_threads,
            quarantined_workflows=tuple(sorted(self.workflow_worker.quarantine.names)),
            lost_step_slots=self.store.lost_step_slots,
            long_polls_open=long_polls_open,
            long_polls_limit=long_polls_limit,
        )

    def stop(self, timeout: float = 30) -> None:
        """Stop polling, let in-flight tasks finish, flush buffers, release leadership.

        Returns within ``timeout`` seconds plus one flush (SPEC §8): activity attempts still
        running then are abandoned to their leases (whatever they report later is dropped,
        and another worker runs them again once their leases lapse); what was buffered is
        written, so nothing acknowledged is lost.
        """
        self._background.stop(timeout)

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
