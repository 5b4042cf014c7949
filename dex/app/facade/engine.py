"""The engine facade (docs/reference/contract.md §5): start, signal, inspect and wait for runs; run the workers.

``Engine`` builds the runtime (workers, buffer, schedulers, the threads of a started engine:
:mod:`dex.app.runtime.assembly`) and, over it, the services its public calls delegate to, one line
each: :class:`~dex.app.facade.starts.Starts`, :class:`~dex.app.facade.messages.RunMessages`,
:class:`~dex.app.facade.reads.RunReads`, :class:`~dex.app.facade.queues.Queues`,
:class:`~dex.app.schedules.calls.ScheduleCalls`, :class:`~dex.app.facade.fork.Forks` and their asyncio
face, :class:`~dex.app.facade.aio.AsyncCalls`. Each service receives what it uses when it is built
(the store, the registry, callbacks such as "nudge the scheduler") and reads nothing of the
engine's. ``Engine.drain()`` runs every step inline, in the caller's thread."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from dex.app.activities.event_loop import AsyncRunner
from dex.app.activities.leases import validate_activity_lease
from dex.app.activities.worker import ActivityWorker
from dex.app.definitions.registry import Registry
from dex.app.facade.aio import AsyncCalls
from dex.app.facade.endings import RunEnds
from dex.app.facade.fork import Forks
from dex.app.facade.info import RunInfo
from dex.app.facade.messages import RunMessages
from dex.app.facade.queries import RunQueries
from dex.app.facade.queues import Queues
from dex.app.facade.reads import RunReads, run_filter
from dex.app.facade.starts import Starts
from dex.app.facade.steps import ActivityStep
from dex.app.facade.streams import StreamReads
from dex.app.facade.updates import RunUpdates
from dex.app.machinery.buffer import ResultBuffer
from dex.app.machinery.threads import Foreground
from dex.app.ports.engines import EngineInfo
from dex.app.ports.notices import POLLING, NoticeSource
from dex.app.ports.store import DEFAULT_ACTIVITY_LEASE, Claim, QueueInfo, Store
from dex.app.ports.telemetry import TelemetryHub
from dex.app.ports.tracing import NoTracing, Tracing
from dex.app.runtime.assembly import SCHEDULER, Runtime, timing
from dex.app.runtime.health import EngineHealth
from dex.app.runtime.leader import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.runtime.long_polls import LongPollGates, LongPolls
from dex.app.runtime.notices import set_dispatch, task_notices
from dex.app.runtime.options import RuntimeOptions
from dex.app.runtime.registration import EngineRegistration
from dex.app.schedules.calls import ScheduleAdmin, ScheduleCalls, drain_bound, drain_jump
from dex.app.schedules.runner import ScheduleRunner
from dex.app.schedules.spec import Schedule, ScheduleInfo
from dex.app.workflows.held import holds_runs
from dex.app.workflows.inline import QueueView
from dex.app.workflows.worker import WorkflowWorker
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, validate_key, validate_text
from dex.domain.errors import InvalidStateError
from dex.domain.status import RunStatus
from dex.serialization.payloads import PayloadConverter as DefaultPayloadConverter


class Engine:
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
        runtime_options: RuntimeOptions | None = None,
        dispatch: str = POLLING,
        kafka: Mapping[str, object] | None = None,
    ) -> None:
        """``runtime_options`` is for simulations and tests: the clock, attempt pool, watchdog
        and randomness of the runtime, and observers of its decisions
        (:class:`dex.app.runtime.options.RuntimeOptions`; the default is production's)."""
        self.store = adapter
        # how workers learn of tasks (docs/reference/contract.md §16): checked before anything is built
        self._dispatch_mode, notices = task_notices(adapter, dispatch, kafka)
        self.registry = Registry(workflows, activities)
        self.node_id = validate_text(node_id, "node_id") if node_id else f"node-{uuid.uuid4()}"
        # names the deployed code in every run this engine starts (docs/reference/contract.md §11)
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
        # the activity thread keeps extending while their attempts run (dex/app/activities/leases.py)
        activity_lease = validate_activity_lease(activity_lease)
        self._async = AsyncRunner()
        # this engine's row in the engine registry (docs/reference/contract.md §15), refreshed
        # with the leadership heartbeat, once per renewal period of the lease
        self._registration = EngineRegistration(
            adapter,
            node_id=self.node_id,
            code_version=self.code_version,
            workflows=tuple(self.registry.workflows),
            activities=tuple(self.registry.activities),
            queues=tuple(d.queue for d in self.registry.workflows.values())
            + tuple(a.queue for a in self.registry.activities.values()),
            period=leader_lease / 3,
        )
        self.leader = LeaderElection(
            adapter, self.node_id, ttl=leader_lease, telemetry=self.telemetry, registration=self._registration
        )
        self.workflow_scheduler = WorkflowTaskScheduler(adapter)
        self.activity_scheduler = ActivityTaskScheduler(adapter)
        self.maintenance = RetentionMaintenance(adapter, retention=retention)
        # the schedules' fires, stepped by the leader
        self.schedules = ScheduleRunner(
            adapter, telemetry=self.telemetry, rng=self._rng, code_version=self.code_version
        )
        # the application's calls (start, send, transitions) go first: see runner.Foreground
        self.foreground = Foreground()
        self._drain_lock = threading.Lock()
        inline = (inline_activity_seconds, chained_activity_seconds)
        inline_seconds, window, deadline = timing(inline, batch_window, workflow_task_deadline, workflow_task_lease)
        options = runtime_options if runtime_options is not None else RuntimeOptions()
        self._queue_view = QueueView(adapter.activity_slots, ttl=options.slots_ttl)
        # the buffer, the workers and the threads of a started engine (Engine.start), built in
        # one place (dex.app.runtime.assembly)
        self._runtime = Runtime(
            adapter,
            self.registry,
            self.converter,
            node_id=self.node_id,
            leader=self.leader,
            workflow_scheduler=self.workflow_scheduler,
            activity_scheduler=self.activity_scheduler,
            maintenance=self.maintenance,
            schedules=self.schedules,
            async_runner=self._async,
            queue_view=self._queue_view,
            foreground=self.foreground,
            telemetry=self.telemetry,
            tracing=self.tracing,
            rng=self._rng,
            poll_interval=poll_interval,
            activity_concurrency=activity_concurrency,
            workflow_task_lease=workflow_task_lease,
            activity_lease=activity_lease,
            executor_cache_size=executor_cache_size,
            holds_runs=holds_runs_,
            inline_seconds=inline_seconds,
            window=window,
            deadline=deadline,
            on_flushed=self._reads.flushed,  # wakes wait(): a run of ours may have just ended
            on_completed=self._reads.written,
            options=options,
            notices=notices,
        )
        # the services the public calls delegate to
        self._starts = Starts(
            adapter,
            self.registry,
            self.converter,
            tracing=self.tracing,
            foreground=self.foreground,
            rng=self._rng,
            code_version=self.code_version,
            create_run=self._runtime.create_run,
            create_keyed_run=self._runtime.create_keyed_run,
            started=self._reads.started,
        )
        self._messages = RunMessages(
            adapter,
            self.converter,
            foreground=self.foreground,
            send_message=self.buffer.send_message,
            nudge_scheduler=self._nudge_scheduler,
        )
        self._ends = RunEnds(
            adapter,
            self.registry.workflows,
            self._messages,
            foreground=self.foreground,
            ended=self._reads.flushed,
            nudge_scheduler=self._nudge_scheduler,
        )
        # updates and queries (docs/reference/contract.md §14): an engine not started drives itself
        self._updates = RunUpdates(
            adapter,
            self.converter,
            foreground=self.foreground,
            nudge_scheduler=self._nudge_scheduler,
            drives=self._drives_itself,
            drive=self._drive_once,
            claim=self._update_claim,
            hand=self._runtime.workflows_claimed,
        )
        self._queries = RunQueries(
            adapter,
            self.registry,
            self.converter,
            cache=self._runtime.workflow_worker.cache,
            drives=self._drives_itself,
            drive=self._drive_once,
        )
        self._queues = Queues(adapter, self._queue_view, queues_changed=self._runtime.queues_changed)
        self._schedule_calls = ScheduleCalls(
            ScheduleAdmin(adapter, self._rng, self.code_version),
            self.schedules,
            self.registry,
            self.converter,
            nudge_scheduler=self._nudge_scheduler,
        )
        self._forks = Forks(
            adapter,
            code_version=self.code_version,
            foreground=self.foreground,
            started=self._reads.started,
            nudge_scheduler=self._nudge_scheduler,
        )
        self._aio = AsyncCalls(self._starts, self._messages, self._reads, self._forks)
        # published values and streams (docs/reference/contract.md §14); a not-started engine is
        # driven by its readers
        self._streams = StreamReads(adapter, self.converter, self._reads, self._drive)
        self._schedule_calls.declare(schedules)  # created, or updated
        for definition in self.registry.workflows.values():
            adapter.ensure_queue(definition.queue, "workflow")
        for activity in self.registry.activities.values():
            adapter.ensure_queue(activity.queue, "activity")

    def _nudge_scheduler(self) -> None:
        self._runtime.nudge(SCHEDULER)

    def _drives_itself(self) -> bool:
        """Whether ``update`` and ``query`` run what is due themselves: an engine with code that is
        not started (tests that drain). One without code (``dex web``, the CLI) only asks the store."""
        return not self._runtime.threads and bool(self.registry.workflows)

    def _update_claim(self, run_id: str) -> Claim | None:
        """The claim a started engine makes with an update's request (its workflow task runs here)."""
        return self._runtime.workflow_claim([run_id]) if self._runtime.active() else None

    def _drive_once(self) -> None:
        self.drain(advance_time=False)

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
        timeout: timedelta | float | None = None,
        id_reuse: str = "allow",
        debounce: timedelta | None = None,
        debounce_max: timedelta | None = None,
    ) -> str:
        """Create a run and return its id (or the id of the live run with this ``instance_id``); with
        ``connection`` (a ``psycopg.Connection``), in its transaction, for the caller to commit (docs/reference/contract.md §9).
        ``timeout`` (a timedelta or seconds) sets the run's deadline: when it passes, the run is
        cancelled with reason "timeout" (``RunInfo.deadline``, docs/reference/contract.md §14).
        ``id_reuse`` says what an ended run's ``instance_id`` means, ``debounce`` delays the start and
        lets later starts replace the arguments (docs/reference/contract.md §15)."""
        return self._starts.start_workflow(
            fn_or_name,
            args,
            instance_id,
            queue,
            priority,
            concurrency_key,
            labels,
            connection,
            timeout,
            id_reuse,
            debounce,
            debounce_max,
        )

    def start_by_name(
        self,
        name: str,
        args: Iterable[Any] = (),
        *,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        force: bool = False,
        id_reuse: str = "allow",
        debounce: timedelta | None = None,
        debounce_max: timedelta | None = None,
    ) -> str:
        """Start a run of the workflow named ``name``, its arguments a sequence. On an engine
        that registers workflows this is ``start_workflow`` (an unknown name:
        ``NotRegisteredError``); on one without any code (``dex web`` over a database) the run
        is made for the engines that have it, on ``queue``, else the queue of the newest run
        of that name, else ``"default"`` (the decorators' default), its arguments checked by
        the code that runs it. There, a name that no live engine registers (``list_engines``)
        is refused with ``NotRegisteredError`` naming it, unless ``force``
        (docs/reference/contract.md §15)."""
        return self._starts.start_by_name(
            name,
            args,
            instance_id=instance_id,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            labels=labels,
            force=force,
            id_reuse=id_reuse,
            debounce=debounce,
            debounce_max=debounce_max,
        )

    def send_event(self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None) -> None:
        """Deliver an external event to a run; it is buffered until the run waits for it. With
        ``connection``, in that connection's transaction (as ``start_workflow``)."""
        self._messages.send_event(run_id, event_id, payload, connection=connection)

    def cancel(self, run_id: str, reason: str = "") -> None:
        """Ask a run to stop at its next await and end CANCELLED (a CREATED run that no engine
        can run ends CANCELLED at once)."""
        self._ends.cancel(run_id, reason)

    def terminate(self, run_id: str, reason: str = "") -> None:
        """Stop a run at once, running none of its code again: its pending steps are dropped,
        its children terminated, and it ends TERMINATED (docs/reference/contract.md §14)."""
        self._ends.terminate(run_id, reason)

    def suspend(self, run_id: str) -> None:
        """Hold back a running run's new events until ``resume``."""
        self._messages.suspend(run_id)

    def resume(self, run_id: str) -> None:
        """Release a suspended run's held events, in order."""
        self._messages.resume(run_id)

    def update(
        self, run_id: str, name: str, *args: Any, update_id: str | None = None, timeout: float | timedelta | None = None
    ) -> Any:
        """Run the workflow's update handler ``name`` with ``args`` inside the run and return its
        result (docs/reference/contract.md §14). The same ``update_id`` twice runs the handler
        once and returns its recorded answer. UpdateRejectedError (its validator refused, or no
        such handler: nothing recorded), UpdateFailedError (the handler raised; the run goes on),
        InvalidStateError (the run has ended), TimeoutError (wall-clock seconds)."""
        return self._updates.update(run_id, name, args, update_id, timeout)

    def query(self, run_id: str, name: str, *args: Any) -> Any:
        """The result of the workflow's query handler ``name`` on the run's current state;
        records nothing, and ended runs answer too. QueryError for an unknown name, a handler
        that raises, or one that tries a step or a change of state."""
        return self._queries.query(run_id, name, args)

    def get_run(self, run_id: str) -> RunInfo:
        """The run, as a ``RunInfo`` (its result decoded with the workflow's return hint)."""
        return self._reads.get_run(run_id)

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
        return self._reads.history(run_id)

    def activity_steps(self, run_id: str) -> list[ActivityStep]:
        """The run's activity steps, oldest first, each with its attempts: how many began, the
        newest failed or lost ones, and while it retries, when the next may begin. It reads the
        run's whole history, as ``history`` does: a call about one run (the dashboard and
        ``GET /v1/runs/{run_id}/activity-steps`` read a page of it at a time)."""
        return self._reads.activity_steps(run_id)

    def export_history(self, run_id: str) -> bytes:
        """The run's history as a protobuf ``WorkflowHistory`` (``dex.testing.load_history`` reads it)."""
        return self._reads.export_history(run_id)

    def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Block until the run ends; return its result or raise its failure."""
        return self._reads.wait(run_id, timeout)

    def fork(self, run_id: str, at: int | None = None, queue: str | None = None) -> str:
        """Start a new run of ``run_id``'s workflow and input whose history is the original's up
        to ``at`` (the sequence number of a ``WorkflowTaskCompleted``, or 1: from the start;
        default: the end of the last workflow task before the run ended, for a live run its
        last one), and return its id (``RunInfo.forked_from`` names the original).

        The steps recorded up to there are not repeated; those pending there (activities,
        timers, children) are started again, and the events the original received after it
        are delivered again (see :mod:`dex.domain.forks` and
        docs/how-to/deploy-new-code.md). ``queue`` puts the fork on another workflow queue. A fork keeps the original's
        instance id: InvalidStateError while a live run holds it. RunNotFoundError for an
        unknown run, TypeError or ValueError for a bad ``at`` or ``queue``; nothing is written
        then.
        """
        return self._forks.fork(run_id, at, queue)

    # -- published values and streams (docs/reference/contract.md §14) -------------------------
    def get_published(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Any:
        """The latest value the run published under ``key`` (``ctx.publish``), waiting up to
        ``timeout`` seconds for a first one (``TimeoutError``); ``InvalidStateError`` if the run
        ended without publishing one."""
        return self._streams.get_published(run_id, key, timeout)

    def read_stream(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Iterator[Any]:
        """An iterator over the run's stream ``key`` from its first item, in order, ending when the
        stream is closed or the run ends; ``timeout`` bounds each wait for the next item
        (``TimeoutError``). ``RunNotFoundError`` at the call for an unknown run."""
        return self._streams.read_stream(run_id, key, timeout)

    def watch_published(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Iterator[Any]:
        """Every value the run publishes under ``key`` from now on (the current one first), ending
        when the run ends; ``timeout`` bounds each wait for a change."""
        return self._streams.watch_published(run_id, key, timeout)

    async def get_published_async(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> Any:
        """``get_published``, awaitable."""
        return await self._streams.get_published_async(run_id, key, timeout)

    def read_stream_async(self, run_id: str, key: str, timeout: float | timedelta | None = None) -> AsyncIterator[Any]:
        """``read_stream`` for ``async for`` (an unknown run raises at the first item)."""
        return self._streams.read_stream_async(run_id, key, timeout)

    def _drive(self) -> None:
        """A reader without its answer drives an engine that is not started (docs/reference/contract.md §14)."""
        if not self._runtime.threads:
            self.drain(advance_time=False)

    # -- asyncio ------------------------------------------------------------------------------
    async def start_workflow_async(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        connection: Any = None,
        timeout: timedelta | float | None = None,
        id_reuse: str = "allow",
        debounce: timedelta | None = None,
        debounce_max: timedelta | None = None,
    ) -> str:
        """``start_workflow``; ``connection`` is a ``psycopg.AsyncConnection`` here (docs/reference/contract.md §9)."""
        return await self._aio.start_workflow(
            fn_or_name,
            *args,
            instance_id=instance_id,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            labels=labels,
            connection=connection,
            timeout=timeout,
            id_reuse=id_reuse,
            debounce=debounce,
            debounce_max=debounce_max,
        )

    async def send_event_async(
        self, run_id: str, event_id: str, payload: Any = None, *, connection: Any = None
    ) -> None:
        """``send_event``; ``connection`` is a ``psycopg.AsyncConnection`` here."""
        await self._aio.send_event(run_id, event_id, payload, connection=connection)

    async def cancel_async(self, run_id: str, reason: str = "") -> None:
        """``cancel``, awaitable."""
        await asyncio.to_thread(self._ends.cancel, run_id, reason)

    async def terminate_async(self, run_id: str, reason: str = "") -> None:
        """``terminate``, awaitable."""
        await asyncio.to_thread(self._ends.terminate, run_id, reason)

    async def suspend_async(self, run_id: str) -> None:
        """``suspend``, awaitable."""
        await self._aio.suspend(run_id)

    async def resume_async(self, run_id: str) -> None:
        """``resume``, awaitable."""
        await self._aio.resume(run_id)

    async def update_async(
        self, run_id: str, name: str, *args: Any, update_id: str | None = None, timeout: float | timedelta | None = None
    ) -> Any:
        """``update``, awaitable (the wait runs in a thread, never on the event loop)."""
        return await asyncio.to_thread(self._updates.update, run_id, name, args, update_id, timeout)

    async def query_async(self, run_id: str, name: str, *args: Any) -> Any:
        """``query``, awaitable (a replay runs in a thread, never on the event loop)."""
        return await asyncio.to_thread(self._queries.query, run_id, name, args)

    async def get_run_async(self, run_id: str) -> RunInfo:
        """``get_run``, awaitable."""
        return await self._aio.get_run(run_id)

    async def list_runs_async(
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
        """``list_runs``, awaitable."""
        return await self._aio.list_runs(
            run_filter(workflow_name, statuses, labels, instance_id, created_after, created_before, limit, code_version)
        )

    async def activity_steps_async(self, run_id: str) -> list[ActivityStep]:
        """``activity_steps``, awaitable."""
        return await self._aio.activity_steps(run_id)

    async def history_async(self, run_id: str) -> list[ev.HistoryEvent]:
        """``history``, awaitable."""
        return await self._aio.history(run_id)

    async def fork_async(self, run_id: str, at: int | None = None, queue: str | None = None) -> str:
        """``fork`` (docs/reference/contract.md §11)."""
        return await self._aio.fork(run_id, at, queue)

    async def wait_async(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Like ``wait``: the result, or WorkflowFailedError / WorkflowCancelledError / TimeoutError.

        A store error (anything but a ``DexError``) is retried until the deadline, as ``wait`` does.
        """
        return await self._aio.wait(run_id, timeout)

    # -- queues -------------------------------------------------------------------------------
    def create_queue(
        self,
        name: str,
        kind: str,
        capacity: int = 100,
        key_concurrency: int = 1,
        rate_limit: tuple[int, timedelta] | None = None,
    ) -> None:
        """Create a queue of ``kind`` ("workflow" or "activity") with ``capacity`` slots, or give
        the existing one these settings. ``key_concurrency``: how many runs sharing a
        concurrency key run at once (workflow queues); ``rate_limit=(n, period)``: at most ``n``
        of its tasks start in any window of ``period``, across all engines (None: no limit)."""
        self._queues.create_queue(name, kind, capacity, key_concurrency, rate_limit)

    def pause_queue(self, name: str, kind: str) -> None:
        """Stop claiming the queue's tasks until ``resume_queue``."""
        self._queues.pause_queue(name, kind)

    def resume_queue(self, name: str, kind: str) -> None:
        """Claim the queue's tasks again."""
        self._queues.resume_queue(name, kind)

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        """How many of the queue's tasks may run at once."""
        self._queues.set_queue_capacity(name, kind, capacity)

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        """How many runs sharing a concurrency key may run at once, granted by this queue."""
        self._queues.set_queue_key_concurrency(name, kind, key_concurrency)

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: tuple[int, timedelta] | None) -> None:
        """At most ``n`` of the queue's tasks start in any window of ``period`` (``(n, period)``),
        across all engines; None removes the limit."""
        self._queues.set_queue_rate_limit(name, kind, rate_limit)

    def list_queues(self) -> list[QueueInfo]:
        """Every queue, with its status, capacity, depth, key concurrency and rate limit."""
        return self._queues.list_queues()

    # -- engines ------------------------------------------------------------------------------
    def list_engines(self) -> list[EngineInfo]:
        """The live engines on this store (this one once started): each started engine's host,
        pid, code version, registered names and queues, by node id (docs/reference/contract.md §15).
        A stopped engine is gone; a crashed one once its row expires (three heartbeat periods,
        a lease of ``leader_lease``)."""
        return self.store.list_engines(self.store.clock.now())

    # -- schedules ----------------------------------------------------------------------------
    def create_schedule(self, schedule: Schedule) -> None:
        """Store a new schedule; InvalidStateError when one has this name."""
        self._schedule_calls.create_schedule(schedule)

    def update_schedule(self, schedule: Schedule) -> None:
        """Replace a schedule's definition, keeping its paused state, note and last fire."""
        self._schedule_calls.update_schedule(schedule)

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule (a declared one comes back at the next engine start)."""
        self._schedule_calls.delete_schedule(name)

    def pause_schedule(self, name: str, note: str = "") -> None:
        """Pause the schedule, with an operator's ``note``: its fires are skipped until resumed."""
        self._schedule_calls.pause_schedule(name, note)

    def resume_schedule(self, name: str) -> None:
        """Resume the schedule from now: the fires due while it was paused are skipped."""
        self._schedule_calls.resume_schedule(name)

    def trigger_schedule(self, name: str) -> str:
        """Start one run of the schedule now, whatever the time, pause or overlap; its run id."""
        return self._schedule_calls.trigger_schedule(name)

    def backfill_schedule(self, name: str, start: datetime, end: datetime) -> list[str]:
        """Start a run for every fire time in ``[start, end)`` that has none yet; their ids."""
        return self._schedule_calls.backfill_schedule(name, start, end)

    def get_schedule(self, name: str) -> ScheduleInfo:
        """The schedule; NotFoundError for an unknown name."""
        return self._schedule_calls.get_schedule(name)

    def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule."""
        return self._schedule_calls.list_schedules()

    # -- running ------------------------------------------------------------------------------
    def drain(self, advance_time: bool = True, until: datetime | timedelta | None = None) -> None:
        """Run everything due in this thread until nothing is left.

        With ``advance_time`` and a VirtualClock, jump the clock to the next timer, retry or
        lease expiry and go on (with ``until``, a datetime or a timedelta from now, to schedule
        fires and then ``until`` too: docs/reference/contract.md §10). This is the tool for deterministic tests.
        A held run (docs/reference/contract.md §11) is retried with its backoff; drain does not wait for it forever:
        after three jumps in a row whose rounds only held runs, it returns. A transaction step
        the store fails every time is given back with a backoff the clock skips: after 20
        rounds in a row, drain raises a ``RuntimeError`` naming the step and the failure.
        """
        with self._drain_lock:
            bound = drain_bound(self.store, until)
            holding = 0  # rounds in a row that did nothing but hold runs
            while True:
                holds = self.workflow_worker.holds
                if self._runtime.rounds.drain():
                    holding = 0
                    stuck = self.activity_worker.stuck_step
                    if stuck is not None:  # the virtual clock skips its backoff: it would run forever
                        raise RuntimeError(f"drain() stopped: {stuck}")
                    continue
                holding += self.workflow_worker.holds > holds
                if self.schedules.step(bound):
                    continue
                if holding >= 3 or not drain_jump(
                    self.store, self.schedules, advance_time, bound if until is not None else None
                ):
                    return

    def start(self) -> None:
        """Start background workers, schedulers, leader election and maintenance.

        Metrics: ``dex.adapters.observability.prometheus.serve_metrics(engine, port)`` serves them
        (needs the ``metrics`` extra).
        """
        if self._runtime.threads:
            raise InvalidStateError("the engine is already started")
        self._registration.register()  # listed from now on (a store that fails: at the next heartbeat)
        if isinstance(self.store, NoticeSource):  # the database writes notices in the Kafka mode only
            set_dispatch(self.store, self._dispatch_mode)
        self._runtime.start()

    def on_activity_work(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (quick, never raising) when this engine makes activity tasks due."""
        self._runtime.on_activity_work(listener)

    def long_poll_gate(self, limit: int) -> LongPolls:
        """A gate of ``limit`` long polls for a remote-worker service over this engine
        (``dex.remote.ActivityTaskService``), counted in :meth:`health` and the metrics."""
        return self._long_polls.gate(limit)

    @property
    def runtime(self) -> Runtime:
        """The runtime that runs this engine's work (read-only; for simulations and tests:
        its rounds, coordinator, threads and what a start lends, :mod:`dex.app.runtime.assembly`)."""
        return self._runtime

    @property
    def buffer(self) -> ResultBuffer:
        """The runtime's result buffer (read-only: the runtime owns it)."""
        return self._runtime.buffer

    @property
    def workflow_worker(self) -> WorkflowWorker:
        """The runtime's workflow worker (read-only: the runtime owns it)."""
        return self._runtime.workflow_worker

    @property
    def activity_worker(self) -> ActivityWorker:
        """The runtime's activity worker (read-only: the runtime owns it)."""
        return self._runtime.activity_worker

    def health(self) -> EngineHealth:
        """The started engine's threads (by name: alive or dead; empty when not started; a dead
        polling thread is logged and replaced, ``dex.app.machinery.watchdog``) and what hostile code or
        clients hold: see :class:`dex.app.runtime.health.EngineHealth`."""
        long_polls_open, long_polls_limit = self._long_polls.figures()
        return EngineHealth(
            threads=self._runtime.health(),
            abandoned_executors=self.workflow_worker.closer.abandoned,
            interrupted_threads=self.workflow_worker.quarantine.interrupted_threads,
            quarantined_workflows=tuple(sorted(self.workflow_worker.quarantine.names)),
            lost_step_slots=self.store.lost_step_slots,
            long_polls_open=long_polls_open,
            long_polls_limit=long_polls_limit,
            dispatch=self._dispatch_mode,
            notices=self._runtime.dispatch_counts.snapshot() if self._dispatch_mode != POLLING else {},
        )

    def stop(self, timeout: float = 30) -> None:
        """Stop polling, let in-flight tasks finish, flush buffers, release leadership.

        Returns within ``timeout`` seconds plus one flush (docs/reference/contract.md §8): activity attempts still
        running then are abandoned to their leases (whatever they report later is dropped,
        and another worker runs them again once their leases lapse); what was buffered is
        written, so nothing acknowledged is lost.
        """
        self._runtime.stop(timeout)
        self._registration.remove()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
