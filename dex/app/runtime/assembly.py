"""The runtime of an engine: its parts, built in one place, and the threads of a started engine
(``Engine.start()``, ``Engine.stop()``).

:class:`Runtime` builds the write buffer, the workflow and activity workers, the coordinator
(:mod:`dex.app.runtime.coordinator`, the one owner of the scheduling state) and the rounds, each from
constructor parameters: nothing is set on a part once it is built. What a simulation replaces —
the clock, the attempt pool, the watchdog's interrupts, randomness, observers — comes in one
value, :class:`~dex.app.runtime.options.RuntimeOptions`, with production defaults. What exists
only while the engine runs — the activity pool, the transaction steps' group threads, inline
activities, the watchdog (:mod:`dex.app.machinery.watchdog`) — is made by :meth:`Runtime.arm` (from
``start()``, or the simulator, which then runs the rounds itself) and lent to the workflow
rounds as one value (:class:`~dex.app.workflows.worker.Started`); ``stop()`` drops it. The
buffer's dispatch ("complete, then claim") is this runtime, active from ``arm`` to the end of
``stop``.

Five threads — scheduler, workflow worker, activity worker, two flushers — plus the activity
pool and the watchdog's. In the Kafka dispatch mode (``Engine(dispatch="kafka")``) two more, the
relay and the notices' receiver (:mod:`dex.app.runtime.notices`), and the worker threads' idle
interval is the slow safety poll. Each thread only calls one round of :mod:`dex.app.runtime.rounds` in a loop
(:class:`dex.app.machinery.threads.PollingThread`), sleeping as long as the round says unless a wake-up
call comes first. What to do and when is decided by the coordinator; this module only carries
out its commands that need a thread or the pool. ``Engine.drain()`` runs the components'
steps inline instead, without any of this.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from dex.app.activities.event_loop import AsyncRunner
from dex.app.activities.worker import ActivityWorker
from dex.app.definitions.registry import Registry
from dex.app.machinery.buffer import ACTIVITY_LANE, WORKFLOW_LANE, ResultBuffer
from dex.app.machinery.threads import AttemptPool, Foreground, Nudge, PollingThread
from dex.app.machinery.watchdog import Watchdog
from dex.app.ports.ids import new_run_id
from dex.app.ports.notices import TaskNotices
from dex.app.ports.store import ActivityOutcome, ActivityTask, AnsweredStep, Claim, Loaded, Store, WorkflowTask
from dex.app.ports.telemetry import TelemetryHub
from dex.app.ports.tracing import Tracing
from dex.app.runtime import coordinator as co
from dex.app.runtime.coordinator import ACTIVITIES, SCHEDULER, WORKFLOWS
from dex.app.runtime.leader import ActivityTaskScheduler, LeaderElection, RetentionMaintenance, WorkflowTaskScheduler
from dex.app.runtime.notices import DispatchCounts, NoticeRounds
from dex.app.runtime.options import ACTIVITY_BATCH, RuntimeOptions
from dex.app.runtime.rounds import LocalDispatch, Rounds
from dex.app.schedules.runner import ScheduleRunner
from dex.app.workflows.inline import InlineActivities, QueueView
from dex.app.workflows.step_groups import GroupThreads, StepGroups
from dex.app.workflows.worker import NOT_STARTED, Started, WorkflowWorker
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.instance_keys import StartRule
from dex.domain.task import WorkflowTaskResult

log = logging.getLogger("dex.engine")

__all__ = ["ACTIVITIES", "SCHEDULER", "WORKFLOWS", "Runtime", "RuntimeOptions", "timing"]


def timing(
    inline: tuple[float, float], batch_window: float, workflow_task_deadline: float, workflow_task_lease: timedelta
) -> tuple[tuple[float, float], float, float]:
    """The engine's timing options, checked: how long an activity may take to run inline (in
    the workflow thread, and chained in an ended attempt's thread: ``inline_activity_seconds``
    and ``chained_activity_seconds``), the batch window, and the watchdog's deadline for
    workflow code (``Engine(...)`` arguments)."""
    for name, seconds in zip(("inline_activity_seconds", "chained_activity_seconds"), inline, strict=True):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"{name} must be a number, got {seconds!r}")
        if seconds != seconds:  # NaN
            raise ValueError(f"{name} must be a number of seconds, got {seconds!r}")
        if seconds < 0:
            raise ValueError(f"{name} must not be negative, got {seconds!r}")
    if isinstance(batch_window, bool) or not isinstance(batch_window, (int, float)) or batch_window < 0:
        raise ValueError(f"batch_window must be a number of seconds >= 0, got {batch_window!r}")
    if isinstance(workflow_task_deadline, bool) or not isinstance(workflow_task_deadline, (int, float)):
        raise TypeError(f"workflow_task_deadline must be a number of seconds, got {workflow_task_deadline!r}")
    if not workflow_task_deadline > 0:
        raise ValueError(f"workflow_task_deadline must be > 0 seconds, got {workflow_task_deadline!r}")
    # see dex.app.machinery.watchdog; at most half the task's lease, so that a blocked task is given
    # back before its lease lets another worker redo it
    deadline = min(float(workflow_task_deadline), workflow_task_lease.total_seconds() / 2)
    return (float(inline[0]), float(inline[1])), float(batch_window), deadline


def _flushing(rounds: Rounds, lane: str) -> Callable[[], float]:
    return lambda: rounds.flush(lane)


def _waiting(buffer: ResultBuffer, lane: str, stopping: threading.Event) -> Callable[[float], object]:
    # stop() sets ``stopping`` before it wakes the buffer: a flusher about to wait sees one or the other
    return lambda seconds: buffer.wait_for_work(seconds, lane, stopping)


class Runtime:
    """The runtime of one engine (see the module docstring): its buffer, its workers, its
    coordinator and the threads a start runs, built here and nowhere else."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        converter: PayloadConverter,
        *,
        node_id: str,
        leader: LeaderElection,
        workflow_scheduler: WorkflowTaskScheduler,
        activity_scheduler: ActivityTaskScheduler,
        maintenance: RetentionMaintenance,
        schedules: ScheduleRunner,
        async_runner: AsyncRunner,
        queue_view: QueueView,
        foreground: Foreground,
        telemetry: TelemetryHub,
        tracing: Tracing,
        rng: random.Random,
        poll_interval: float,
        activity_concurrency: int,
        workflow_task_lease: timedelta,
        activity_lease: timedelta,
        executor_cache_size: int,
        holds_runs: bool,
        inline_seconds: tuple[float, float],
        window: float,
        deadline: float,
        on_flushed: Callable[[], None],
        on_completed: Callable[[str, str, ev.RunCompleted], None],
        options: RuntimeOptions | None = None,
        notices: TaskNotices | None = None,
    ) -> None:
        options = options if options is not None else RuntimeOptions()
        self.node_id, self.telemetry, self.leader = node_id, telemetry, leader
        self._store, self._registry = store, registry
        self._on_flushed, self._on_completed = on_flushed, on_completed
        self._async, self._queue_view = async_runner, queue_view
        self._poll_interval = poll_interval
        self._activity_concurrency = activity_concurrency
        self._inline_seconds = inline_seconds
        self._deadline = deadline  # see dex.app.machinery.watchdog
        self._lease = workflow_task_lease
        self._options = options
        # the threads' wake-up calls, one channel per polling thread (the flushers wait on the buffer)
        self._nudge = Nudge()
        self._wakes = {topic: self._nudge.channel(topic) for topic in (SCHEDULER, WORKFLOWS, ACTIVITIES)}
        self._stopping = threading.Event()  # the threads' loops end (the coordinator's state says why)
        self._stopping.set()  # nothing runs until arm(): inline activities too read it
        self._running = threading.Event()  # from arm() to the end of stop(): the dispatch is active
        self.threads: list[PollingThread] = []
        self._activity_listeners: list[Callable[[], None]] = []  # told when activity work is due
        # this start's: the activity pool, the group threads, what the workflow rounds are lent
        self._pool: AttemptPool | None = None
        self._groups: GroupThreads | None = None
        self._started: Started | None = None
        self._monotonic = options.monotonic
        settings = co.Settings(
            poll_interval=poll_interval,
            window=window,
            activity_capacity=activity_concurrency,
            activity_batch=options.activity_claim,
            workflow_batch=workflow_scheduler.batch_size,
            runs_activities=bool(registry.activities),
        )
        self.coordinator = co.Coordinator(settings, wake=self._wake, run=self._run_activity, observe=options.observe)
        # the parts: each gets what it uses here; where two need each other (the buffer hands
        # the workers what completions claim, the workers add to the buffer), the buffer gets
        # this runtime's methods, which reach the part built after it
        self.buffer = ResultBuffer(
            store,
            on_flush=self._flushed,
            on_written=self._written,
            telemetry=telemetry,
            activity_lease=activity_lease,
            dispatch=self,
            give_back=self._give_back,
        )
        self.activity_worker = ActivityWorker(
            store,
            registry,
            converter,
            self.buffer,
            node_id,
            rng=rng,
            async_runner=async_runner,
            batch_size=max(ACTIVITY_BATCH, options.activity_claim),
            telemetry=telemetry,
            tracing=tracing,
            lease=activity_lease,
            answered=self._answer,  # one write per activity (dex.app.workflows.answers)
            completed_directly=self.queues_changed,  # a transaction step wrote its completion
            durations=options.durations,
        )
        self.workflow_worker = WorkflowWorker(
            store,
            registry,
            converter,
            self.buffer,
            node_id,
            lease=workflow_task_lease,
            batch_size=options.workflow_round,
            cache_size=executor_cache_size,
            telemetry=telemetry,
            tracing=tracing,
            holds_runs=holds_runs,
            foreground=foreground,
            rng=options.jitter,
            monotonic=options.monotonic,
            unstarted=self._drain_inline(options),
        )
        self._dispatch = LocalDispatch(
            self.coordinator,
            self.activity_worker,
            self.workflow_worker,
            node_id,
            wake_workflows=self._wakes[WORKFLOWS].set,
            idle_after=window,
            running=self._running,
            handed=options.handed,
        )
        # the rounds the threads of every start run (the simulator runs them itself); what a
        # start lends the workflow rounds they ask for at each round
        self.rounds = Rounds(
            self.coordinator,
            store=store,
            leader=leader,
            workflow_scheduler=workflow_scheduler,
            activity_scheduler=activity_scheduler,
            maintenance=maintenance,
            schedules=schedules,
            workflow_worker=self.workflow_worker,
            activity_worker=self.activity_worker,
            buffer=self.buffer,
            telemetry=self.telemetry,
            poll_interval=poll_interval,
            monotonic=options.monotonic,
            started=self._lent,
            claim_interval=notices.safety_poll if notices is not None else None,
        )
        # the event-driven dispatch mode's relay and receiver (dex.app.runtime.notices)
        self.dispatch_counts = DispatchCounts()
        self._notices = notices
        self.notice_rounds = (
            NoticeRounds(
                notices,
                self._dispatch,
                leader,
                store.clock,
                telemetry,
                self.dispatch_counts,
                receive_timeout=max(0.05, min(poll_interval, 0.5)),
            )
            if notices is not None
            else None
        )

    @property
    def started(self) -> Started | None:
        """What this start lends the workflow rounds (None while the engine does not run)."""
        return self._started

    @property
    def watchdog(self) -> Watchdog | None:
        """This start's watchdog (None while the engine does not run): its thread steps it, or
        the simulator does."""
        started = self._started
        return started.watchdog if started is not None else None

    def _lent(self) -> Started:
        started = self._started
        return started if started is not None else NOT_STARTED

    # -- the buffer's dispatch ("complete, then claim": rounds.LocalDispatch) ----------------------
    def active(self) -> bool:
        return self._running.is_set()

    def activity_claim(self) -> Claim | None:
        return self._dispatch.activity_claim()

    def activities_claimed(self, claim: Claim, tasks: list[ActivityTask]) -> None:
        self._dispatch.activities_claimed(claim, tasks)

    def workflow_claim(self, run_ids: Sequence[str]) -> Claim | None:
        return self._dispatch.workflow_claim(run_ids)

    def start_claim(self) -> Claim | None:
        return self._dispatch.start_claim()

    def workflows_claimed(
        self, tasks: list[WorkflowTask], loaded: list[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        self._dispatch.workflows_claimed(tasks, loaded, now)

    # -- the buffer's callbacks ------------------------------------------------------------------
    def _flushed(self, left: frozenset[str]) -> None:
        self.flushed(left)  # wakes the threads the flush left work for
        self._on_flushed()  # wakes wait(): a run of ours may have just ended

    def _written(self, task: WorkflowTask, result: WorkflowTaskResult, applied: bool) -> None:
        if applied and not isinstance(task, AnsweredStep):
            self.task_written()
        if applied and result.completion is not None:
            self._on_completed(task.run_id, task.workflow_name, result.completion)
        self.workflow_worker.written(task, applied)

    def _give_back(self, task: WorkflowTask, reason: str, exc: BaseException | None) -> bool:
        """A result the store refuses even as the run's failure: its task is retried later."""
        return self.workflow_worker.retry_later(task, reason, exc)

    def _wake(self, topics: frozenset[str]) -> None:
        self._nudge(*topics)
        if not topics or ACTIVITIES in topics:
            for listener in tuple(self._activity_listeners):
                try:
                    listener()  # a remote worker's long poll (dex.remote): activity tasks may be due
                except Exception:
                    log.exception("a listener for activity work failed")

    def on_activity_work(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (quick, never raising) when this engine makes activity tasks due."""
        self._activity_listeners.append(listener)

    def nudge(self, *topics: str) -> None:
        """This process made work for the threads of these topics (all of them, without any)."""
        self.coordinator.handle(co.Nudged(frozenset(topics), self._monotonic()))

    def queues_changed(self) -> None:
        """A queue takes work again (resumed, or more capacity): schedule activities, wake all."""
        self.coordinator.handle(co.QueuesChanged())

    def flushed(self, left: frozenset[str]) -> None:
        """A flush left this work for others (wakes whoever has it)."""
        self.coordinator.handle(co.Flushed(left))

    def task_written(self) -> None:
        """The store applied the result of a workflow task of a queue (room for the next one
        there; an answered step took no slot, so its write is not one of these)."""
        self.coordinator.handle(co.TaskWritten(self._monotonic()))

    def create_run(self, created: ev.RunCreated) -> str:
        """Create the run; on a started engine, claim its first workflow task at once if it may
        be scheduled straight away (else the scheduler creates it, and wakes a worker)."""
        claim = self.start_claim() if self.active() else None
        now = self._store.clock.now()
        if claim is None:
            run_id = self._store.create_run(new_run_id(), created, now)
            self.nudge(SCHEDULER)
            return run_id
        run_id, claimed, loaded = self._store.create_run_then_claim(new_run_id(), created, now, claim)
        if claimed:
            self.telemetry.tasks_claimed("workflow", len(claimed))
            self.workflows_claimed(claimed, loaded, now)
        else:
            self.nudge(SCHEDULER)
        return run_id

    def _drain_inline(self, options: RuntimeOptions) -> Started:
        """What rounds that no start lends anything to (``drain()``) run inline: nothing, unless
        the options ask for a started engine's inline attempts there (tests of them that drain)."""
        if options.drain_inline is None:
            return NOT_STARTED
        never_stopping = threading.Event()  # drain runs its rounds until nothing is left
        view = QueueView(self._store.activity_slots, ttl=options.slots_ttl)
        return Started(
            inline=InlineActivities(self.activity_worker, view, self.node_id, options.drain_inline, never_stopping)
        )

    def create_keyed_run(self, created: ev.RunCreated, rule: StartRule) -> str:
        """Start a run under ``rule`` (its instance id's earlier runs looked at: docs/reference/contract.md §15),
        then wake the scheduler (a run made now, or one whose start moved, is its work)."""
        run_id = self._store.start_keyed_run(new_run_id(), created, self._store.clock.now(), rule)
        self.nudge(SCHEDULER)
        return run_id

    def _inline_activities(self) -> InlineActivities | None:
        """The inline activities the engine's options ask for (None: none run inline)."""
        typical, chained = self._inline_seconds
        if typical <= 0:  # 0: nothing runs inline, chained or not
            return None
        return InlineActivities(
            self.activity_worker, self._queue_view, self.node_id, typical, self._stopping, chained=chained
        )

    def arm(self) -> None:
        """Get ready to run rounds: a fresh coordinator state, a pool for activity attempts,
        eager dispatch on, and what the workflow rounds are lent (inline activities, the
        transaction steps' group threads and a watchdog, :class:`~dex.app.workflows.worker.Started`),
        each made as the options say. ``start()`` does it before its threads; the simulator
        does it over simulated parts (``Engine(runtime_options=...)``), and runs the rounds."""
        options = self._options
        self._stopping.clear()
        self.coordinator.reset()
        self._pool = options.attempt_pool(self._activity_concurrency)
        self._groups = groups = GroupThreads(options.group_threads) if options.group_threads else None
        inline = self._inline_activities()
        steps = None
        if inline is not None:
            steps = StepGroups(self._store, inline, self._registry, self._store.clock, self._lease)
        # made before any round runs (start()'s threads, or the simulator's steps): the first
        # task may be claimed at once, and its workflow code is watched from the start
        watchdog = Watchdog(
            self.workflow_worker,
            self.threads,
            self._stopping,
            deadline=self._deadline,
            telemetry=self.telemetry,
            quarantine=self.workflow_worker.quarantine,
            clock=options.monotonic,
            interrupt=options.interrupt,
        )
        self._started = Started(watchdog=watchdog, inline=inline, steps=steps, groups=groups)
        self._running.set()

    def disarm(self) -> None:
        """Eager dispatch off: adders flush themselves again and completions claim nothing, the
        rest of the start as it was (the simulator settles its cluster so, with a drain)."""
        self._running.clear()

    def _answer(self, outcome: ActivityOutcome) -> bool:
        """Answer the step an attempt's outcome is for, where this engine holds its run
        (``WorkflowWorker.answer``; False: it does not, or the engine does not run)."""
        started = self._started
        return started is not None and not self._stopping.is_set() and self.workflow_worker.answer(outcome, started)

    def start(self) -> None:
        """Start the threads (the engine checked that none run)."""
        self._open_notices()
        self.arm()
        watchdog = self.watchdog
        assert watchdog is not None  # armed
        rounds = self.rounds
        backoff = self._poll_interval  # a failed round is tried again after 2, 4, 8 ... poll intervals (at most 2 s)
        for name, step, wake in (
            ("dex-scheduler", rounds.scheduler, self._wakes[SCHEDULER]),
            ("dex-workflow-worker", rounds.workflows, self._wakes[WORKFLOWS]),
            ("dex-activity-worker", rounds.activities, self._wakes[ACTIVITIES]),
        ):
            self._thread(PollingThread(name, step, wake.wait, wake.clear, self._stopping, backoff=backoff))
        for name, lane in (("dex-flusher-activities", ACTIVITY_LANE), ("dex-flusher-workflows", WORKFLOW_LANE)):
            # a flusher sleeps on the buffer's own condition: it flushes as soon as there is work
            self._thread(
                PollingThread(
                    name,
                    _flushing(rounds, lane),
                    _waiting(self.buffer, lane, self._stopping),
                    None,
                    self._stopping,
                    backoff=backoff,
                )
            )
        self._start_notices(backoff)
        tick = max(0.01, min(0.25, watchdog.stall / 4))
        never = threading.Event()
        self._thread(
            PollingThread("dex-watchdog", watchdog.round(tick), never.wait, None, self._stopping, backoff=tick)
        )

    def _open_notices(self) -> None:
        """Connect the event-driven mode's notices before any thread starts: a broker that
        cannot be reached fails the start, and nothing runs."""
        notices = self._notices
        if notices is None:
            return
        registry = self._registry
        notices.open(
            sorted({d.queue for d in registry.workflows.values()}),
            sorted({a.queue for a in registry.activities.values()}),
            sorted(set(registry.workflows) | set(registry.activities)),
        )

    def _start_notices(self, backoff: float) -> None:
        """The event-driven mode's two threads (none in the polling mode)."""
        rounds = self.notice_rounds
        if rounds is None:
            return
        never = threading.Event()  # the relay polls the outbox; the receiver waits on the broker
        for name, step in (("dex-relay", rounds.relay), ("dex-notices", rounds.receive)):
            self._thread(PollingThread(name, step, never.wait, None, self._stopping, backoff=max(backoff, 0.1)))

    def _thread(self, thread: PollingThread) -> None:
        self.threads.append(thread)
        thread.start()

    def health(self) -> dict[str, bool]:
        """Each thread, by name: alive or dead; empty when not started."""
        threads = {thread.name: thread.alive for thread in list(self.threads)}
        if threads:
            threads["dex-async-activities"] = self._async.alive
        return threads

    def _run_activity(self, task: ActivityTask) -> None:
        """Run a claimed attempt in the pool (the coordinator's command; its slot is reserved)."""
        key = co.attempt_key(task)
        pool = self._pool

        def ended() -> None:  # its slot is free again
            self.coordinator.handle(co.AttemptEnded(key))

        try:
            if pool is None:
                raise RuntimeError("the engine stopped")
            if self._options.await_on_loop and self.activity_worker.awaits(task.name):
                # an async def activity holds no pool thread while it awaits; the rest of the
                # attempt (its outcome, the step it answers) comes back to the pool
                self.activity_worker.run_awaited(task, lambda rest: self._after_awaited(rest, ended))
                return
            pool.call(self.activity_worker.run, task, then=ended)
        except BaseException:  # noqa: BLE001 - the pool is shut down (the engine stops): the lease brings it back
            log.info(
                "could not run activity %s of run %s; it is retried when its lease expires",
                task.name,
                task.run_id,
                extra={"run_id": task.run_id, "activity_name": task.name},
            )
            ended()

    def _after_awaited(self, rest: Callable[[bool], None], ended: Callable[[], None]) -> None:
        """The rest of an awaited attempt, called from the event loop's thread: on a pool thread,
        then its slot freed. Never on the loop's own thread with answering (the answer may run
        the run's next activities inline, an ``async def`` one waiting for this very loop):
        should the pool not take it (the engine stops, no thread could be started), the outcome
        is recorded and buffered here without answering, and written the ordinary way."""
        pool = self._pool
        try:
            if pool is not None:
                pool.call(rest, True, then=ended)
                return
        except BaseException:  # shut down meanwhile, or no thread could be started
            log.info("the pool did not take the end of an awaited activity attempt", exc_info=True)
        try:
            rest(False)
        finally:
            ended()

    def stop(self, timeout: float = 30) -> None:
        """Stop the threads and let in-flight tasks finish, flush, release leadership (``Engine.stop``)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self.coordinator.handle(co.StopRequested())  # wakes every thread
        self.buffer.wake()
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._pool is not None:
            # no waiting here: attempts not started yet are cancelled (their leases lapse),
            # the running ones get until the deadline
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            while self.coordinator.state.running and time.monotonic() < deadline:
                time.sleep(0.01)
        abandoned = list(self.coordinator.state.running.values())
        if abandoned:
            self.buffer.abandon(abandoned)
            log.warning(
                "stop: %d activity attempt(s) still running after %g s are abandoned to their leases (%s)",
                len(abandoned),
                timeout,
                ", ".join(f"{task.name} of run {task.run_id}" for task in abandoned[:5]),
            )
        if self._groups is not None:  # their tasks' results go to the buffer: before its last flush
            self._groups.close(deadline)
            self._groups = None
        self._running.clear()  # adders flush themselves again, completions claim nothing
        self._started = None  # no step is answered, nothing runs inline, no watchdog watches
        stuck = [thread for thread in self.threads if thread.alive and not thread.retired]
        try:
            if stuck:  # the workflow worker may still be in its round: leave its tasks alone
                names = ", ".join(thread.name for thread in stuck)
                log.warning("stop: %d engine thread(s) did not end within %g s: %s", len(stuck), timeout, names)
            else:
                # tasks a last completion claimed for us after the workflow thread left
                while self.workflow_worker.poll_once(claim=False, close=False):  # forget() closes
                    pass
            self.buffer.flush()
            if len(self.buffer):  # outcomes of answered steps the store declined (dex.app.workflows.answers)
                self.buffer.flush()
        except Exception:  # the store is down: what is unwritten comes back when its leases expire
            log.exception("the final flush failed; unwritten results will be redone after their leases expire")
        finally:
            # closing runs workflow code (finally blocks), which no watchdog watches now
            self.workflow_worker.forget(timeout=max(0.5, deadline - time.monotonic()))
            try:
                self.leader.release()
            except Exception:  # the lease lapses on its own
                log.warning("could not release leadership; it lapses with its lease", exc_info=True)
            self._async.close(timeout=max(0.2, deadline - time.monotonic()))
            self.threads.clear()
            if self._notices is not None:
                try:
                    self._notices.close()
                except Exception:  # the broker is gone: its consumer group lets the session lapse
                    log.warning("could not close the Kafka notices", exc_info=True)
