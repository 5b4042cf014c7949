"""The workflow worker: claims workflow tasks, loads each run's history and inbox, decides
purely (:mod:`dex.domain.task`), and hands the results to the result buffer.

Like every worker it is a plain object whose ``poll_once()`` does one round; the engine's
threads call it in a loop and ``Engine.drain()`` calls it inline, which is what makes a whole
engine steppable from one thread. What a task starts from (a cached executor, or the whole
history) is :mod:`dex.app.workflows.executors`.

A started engine lends each round (and each step answered in an attempt's thread,
:mod:`dex.app.workflows.answers`) what exists only while it runs, as a :class:`Started` value: the
watchdog that notices blocking workflow code (:mod:`dex.app.machinery.watchdog`), inline activities
(:mod:`dex.app.workflows.inline`), transaction steps in groups (:mod:`dex.app.workflows.step_groups`) and the threads
where those groups go on. ``drain()`` passes none of them.

**Transaction steps in groups.** A result that waits on a step that may run in a group is
*parked* instead of done; once the round has decided its tasks, the parked ones go on group
after group — in a started engine's group threads, so that the round decides its next tasks
meanwhile, else in the round's own thread — until each is done, and their results go to the
buffer as the round's do. A parked result is a whole result as it is: written, it makes its
step a task of its own; that is what happens to it when the group threads are closed (the
engine stops) or its executor is gone.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import attrs

from dex.app.definitions.registry import Registry
from dex.app.machinery.buffer import ResultBuffer
from dex.app.machinery.quarantine import Quarantine
from dex.app.machinery.refusals import failed_result
from dex.app.machinery.threads import Foreground
from dex.app.ports.store import (
    ActivityOutcome,
    AnsweredStep,
    Loaded,
    Store,
    UnreadableHistoryError,
    WorkflowInput,
    WorkflowTask,
)
from dex.app.ports.telemetry import Telemetry, TelemetryHub
from dex.app.ports.tracing import NoTracing, Tracing
from dex.app.workflows.answers import answered_step, write_ordinarily
from dex.app.workflows.executors import (
    Closer,
    ExecutorCache,
    Given,
    GivenBack,
    Preloaded,
    Round,
    Unwritten,
    round_inputs,
    start_point,
)
from dex.app.workflows.held import give_back, mismatch, unreadable
from dex.app.workflows.inline import InlineActivities
from dex.app.workflows.step_groups import GroupThreads, Parked, StepGroups
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import RunNotFoundError
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import InboxMessage, WorkflowTaskResult, advance, replay_history
from dex.domain.values import FailureInfo
from dex.serialization.history import encode_ahead

if TYPE_CHECKING:
    from dex.app.machinery.watchdog import Watchdog

log = logging.getLogger("dex.worker")


@attrs.frozen(kw_only=True)
class Started:
    """What a started engine lends the worker's rounds (see the module docstring); each is
    None where the engine does without it (``drain()``: all of them)."""

    watchdog: Watchdog | None = None
    inline: InlineActivities | None = None
    steps: StepGroups | None = None
    groups: GroupThreads | None = None

    def watched(self, task: WorkflowTask, executor: WorkflowExecutor | None) -> AbstractContextManager[None]:
        """Around workflow code: the watchdog notices if it runs past the task's deadline."""
        watchdog = self.watchdog
        return watchdog.watch(task, executor) if watchdog is not None else nullcontext()


NOT_STARTED = Started()


class WorkflowWorker:
    """Runs workflow tasks: load history and inbox, decide purely, buffer the result."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        converter: PayloadConverter,
        buffer: ResultBuffer,
        node_id: str,
        *,
        lease: timedelta = timedelta(seconds=10),
        batch_size: int = 64,
        cache_size: int = 1000,
        telemetry: Telemetry | None = None,
        tracing: Tracing | None = None,
        holds_runs: bool = True,
        foreground: Foreground | None = None,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        unstarted: Started = NOT_STARTED,
    ) -> None:
        self._store, self._registry, self._converter, self._buffer = store, registry, converter, buffer
        self._monotonic = monotonic  # the clock of idle_for (a simulation's is virtual)
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._node_id, self._lease, self._batch_size = node_id, lease, batch_size
        self._rng = rng if rng is not None else random.Random()  # jitter of retry_later's backoff only
        self._names = frozenset(registry.workflows)
        # a history the code does not match holds the run instead of failing it (dex.app.workflows.held)
        self._holds_runs = holds_runs
        # the application's calls in flight, which the worker lets go first (runner.Foreground)
        self._foreground = foreground if foreground is not None else Foreground(pause=0)
        self.worked_at = float("-inf")  # monotonic() at the end of the last round that ran tasks
        self.claimed_full = False  # the last round's claim got all it asked for: more may wait
        # every executor this worker drops is closed through it (dex.app.workflows.executors: it counts
        # the coroutines that refuse to close); the quarantine is fed by the watchdog
        self.closer = Closer(self._telemetry)
        self.quarantine = Quarantine(self._telemetry)
        self.cache = ExecutorCache(cache_size, self.closer)
        # keyed by claim (task id, lease version): a node may hold two claims of one task
        self._unwritten = Unwritten()
        # tasks claimed for us by a completion ("complete, then claim"), waiting to be run, each
        # with its input when the completion loaded it too (and the time it was loaded at)
        self._handed: list[tuple[WorkflowTask, Given | None]] = []
        # guards what other threads reach: the handed tasks (the flushers hand them in) and each
        # round's jobs, results and parked tasks (the watchdog hands a blocked thread's round over
        # to another thread, a group thread finishes the parked ones); a lock of the worker's
        # own, since these belong to it and every thread that touches them goes through it
        self._handed_lock = threading.Lock()
        self._rounds: dict[int, Round] = {}  # by thread: the round each thread is running
        # what rounds that no started engine lends anything to run with (drain(): nothing
        # inline, unless the runtime's options ask for it)
        self._unstarted = unstarted
        self.holds = 0  # how many times a task was given back holding its run (Engine.drain reads it)

    @property
    def names(self) -> frozenset[str]:
        """The workflows this worker claims tasks of: its registry's, but those quarantined."""
        quarantined = self.quarantine.names
        return self._names - quarantined if quarantined else self._names

    @property
    def lease(self) -> timedelta:
        return self._lease

    def room(self) -> int:
        """How many more tasks may be handed to this worker (up to four rounds' worth wait)."""
        with self._handed_lock:
            return max(0, 4 * self._batch_size - len(self._handed))

    def idle_for(self) -> float:
        """Seconds since this worker last ran a task (infinite if it never did)."""
        return self._monotonic() - self.worked_at

    def backlog(self) -> int:
        """How many handed tasks wait for a round."""
        with self._handed_lock:
            return len(self._handed)

    def hand(
        self, tasks: Sequence[WorkflowTask], loaded: Sequence[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        """Tasks already claimed for this worker: the next round runs them without a claim, and,
        for those whose input came along (``loaded`` at ``now``), without a load."""
        inputs = [Given(loaded=item, at=now) for item in loaded] if loaded and now is not None else [None] * len(tasks)
        with self._handed_lock:
            self._handed.extend(zip(tasks, inputs, strict=True))

    def poll_once(self, claim: bool = True, *, close: bool = True, started: Started | None = None) -> int:
        """Execute up to one batch of workflow tasks (handed ones first, then, with ``claim``,
        claimed ones), with what a started engine lends (``started``); return how many ran.
        Then, with ``close``, close the executors dropped meanwhile, here or by other threads
        (:class:`~dex.app.workflows.executors.Closer`)."""
        if started is None:
            started = self._unstarted
        try:
            return self._poll(claim, started)
        finally:
            if close and len(self.closer):
                self.close_dropped(started.watchdog)

    def close_dropped(self, watchdog: Watchdog | None = None) -> int:
        """Close the executors dropped so far, in this thread, each watched like workflow code
        (its ``finally`` blocks run, and may block) by ``watchdog`` if given; return how many."""
        return self.closer.close_dropped(watchdog.watch_close if watchdog is not None else None)

    def _poll(self, claim: bool, started: Started) -> int:
        names = self.names
        if not names:
            return 0
        with self._handed_lock:
            handed, self._handed = self._handed[: self._batch_size], self._handed[self._batch_size :]
        tasks = [task for task, _input in handed]
        self.claimed_full = False
        if claim and len(tasks) < self._batch_size:
            now = self._store.clock.now()
            limit = self._batch_size - len(tasks)
            try:
                claimed = self._store.claim_workflow_tasks(names, self._node_id, now, self._lease, limit)
            except Exception:
                # the store failed the claim: the tasks handed to us stay ours for the next
                # round (the polling thread backs off first)
                with self._handed_lock:
                    self._handed[:0] = handed
                raise
            if claimed:
                self._telemetry.tasks_claimed("workflow", len(claimed))
            self.claimed_full = len(claimed) == limit  # the queue may hold more
            handed += [(task, None) for task in claimed]
            tasks += claimed
        if not tasks:
            return 0
        # one round trip loads what came without its input: the tails after cached executors,
        # else whole histories; the round's results go to the buffer together: its flush writes
        # them in one transaction, instead of the first alone and the rest after it
        round_ = Round()
        round_.jobs.extend(round_inputs(self._store, self.cache, handed, self._give_back_unloaded, self.closer))
        ident = threading.get_ident()
        with self._handed_lock:
            self._rounds[ident] = round_  # the watchdog may hand the rest over to another thread
        foreground = self._foreground
        try:
            while True:
                with self._handed_lock:
                    if not round_.jobs:
                        break
                    job = round_.jobs.popleft()
                task, began = job.task, time.perf_counter()
                result = self.execute(task, preloaded=job.preloaded, started=started)
                if result is not None:
                    if foreground.busy() and result.new_events:
                        # the flusher writes a round without stepping aside: encode here, meanwhile
                        result = _encoded_ahead(result)
                    self._decided(round_, task, result, started.steps)
                    outcome = "progressed" if result.completion is None else result.completion.status.value.lower()
                    self._telemetry.task_finished("workflow", task.workflow_name, outcome, time.perf_counter() - began)
                foreground.step_aside()  # an application's call waiting for the store goes first
            self._go_on(round_, started)
        finally:
            with self._handed_lock:
                self._rounds.pop(ident, None)
                left, done = list(round_.jobs), round_.take()
                round_.jobs.clear()
            # dropped: closed at the end of this round
            self.closer.all(job.preloaded.cached.executor for job in left if job.preloaded.cached is not None)
            if done:  # also when a later task of the round raised: what is decided is written
                self._buffer.add_workflow_results(done)
        self.worked_at = self._monotonic()
        return len(tasks)

    def hand_over(self, thread: int) -> int:
        """Give the round that ``thread`` is running up to the next round of another thread (the
        watchdog found ``thread`` blocked in workflow code): the results decided so far go to the
        buffer now, the tasks not yet started are handed back, their executors to the cache.
        Returns how many tasks were handed back."""
        with self._handed_lock:
            round_ = self._rounds.pop(thread, None)
            if round_ is None:
                return 0
            left, done = list(round_.jobs), round_.take()
            round_.jobs.clear()
            self._handed[:0] = [(job.task, job.preloaded.given) for job in left]
        for job in left:
            if (entry := job.preloaded.cached) is not None:
                self.cache.put(job.task.run_id, entry.executor, entry.last_seq)
        if done:
            self._buffer.add_workflow_results(done)
        return len(left)

    def execute(
        self, task: WorkflowTask, preloaded: Preloaded | None = None, started: Started = NOT_STARTED
    ) -> WorkflowTaskResult | None:
        """Decide ``task``; None when there is nothing to write: its run no longer exists
        (retention took it), the task failed for a reason outside its workflow code and was
        given back to be retried (:meth:`retry_later`), or the watchdog gave the task back while
        its workflow code blocked (the result is discarded).

        Workflow code never fails a task: whatever it raises is caught by the core and becomes
        the run's ``RunCompleted(FAILED)`` in the result (a history the code does not match or
        cannot read holds the run instead, unless ``holds_runs`` is off: :mod:`dex.app.workflows.held`). So an
        exception that escapes loading, replaying or advancing is the machinery's — the store
        unreachable, a bug of dex — and fails only the task (docs/reference/contract.md §8), which is retried with
        a backoff; a bug that recurs on every attempt is retried (and logged) every 5 minutes
        at most, and the run waits, FAILED by nothing but its own code."""
        watchdog = started.watchdog
        if watchdog is None:
            return self._decide(task, preloaded, started)
        try:
            result = self._decide(task, preloaded, started)
        finally:
            abandoned = watchdog.abandoned(task)
        if abandoned:
            self._drop(task)
            return None
        return result

    def _drop(self, task: WorkflowTask) -> None:
        """Close what a task given back by the watchdog left behind (its executor)."""
        entry = self._unwritten.pop(task)
        if entry is not None:
            self.closer(entry.executor)
        self.cache.discard(task.run_id)

    def _decide(self, task: WorkflowTask, preloaded: Preloaded | None, started: Started) -> WorkflowTaskResult | None:
        now = preloaded.given.at if preloaded is not None else self._store.clock.now()
        if self.quarantine.holds(task.workflow_name):  # claimed before: not run here (dex.app.machinery.quarantine)
            if preloaded is not None and preloaded.cached is not None:
                self.closer(preloaded.cached.executor)
            self.retry_later(task, f"workflow {task.workflow_name} is quarantined in this process")
            return None
        executor: WorkflowExecutor | None = None
        try:
            if isinstance(task, AnsweredStep):
                answering = self._answer_start(task, preloaded)
                if answering is None:
                    return None
                executor, last_seq, history, inbox = answering
            else:
                executor, last_seq, history, inbox = start_point(
                    self._store, self.cache, task, now, preloaded, self.closer
                )
        except RunNotFoundError:
            log.info(
                "dropping workflow task %s: run %s no longer exists",
                task.task_id,
                task.run_id,
                extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
            )
            return None
        except GivenBack:  # its round's load failed, and it was given back already
            return None
        except UnreadableHistoryError as exc:
            if (
                self._holds_runs
            ):  # code that can read it may be deployed: the run waits (docs/reference/contract.md §11)
                self.retry_later(task, f"the run is held: {exc}", failure=unreadable(str(exc)))
                return None
            log.error("%s; the run fails", exc, extra={"run_id": task.run_id, "workflow_name": task.workflow_name})
            return failed_result(task.run_id, exc.last_seq, exc.message_ids, now, unreadable(str(exc)))
        except Exception as exc:  # noqa: BLE001 - the store failed the load: the task, not the run
            self.retry_later(task, f"loading its run failed: {_describe(exc)}", exc)
            return None
        try:
            created = executor.created if executor is not None else history[0].event
            trace_context = created.trace_context if isinstance(created, ev.RunCreated) else ()
            attributes: dict[str, str | int] = {
                "dex.run_id": task.run_id,
                "dex.workflow": task.workflow_name,
                "dex.task_id": task.task_id,
            }
            with self._tracing.span(f"dex.workflow-task {task.workflow_name}", trace_context, attributes):
                if executor is None:
                    with started.watched(task, None):
                        executor = replay_history(
                            self._registry.workflows[task.workflow_name],
                            task.run_id,
                            history,
                            self._converter,
                            activities=self._registry.find_activity,
                            workflows=self._registry.find_workflow,
                        )
                    if started.watchdog is not None and started.watchdog.gave_up(task):
                        executor.abandon()  # it blocked in replay: nothing of the new block may run
                with started.watched(task, executor):
                    result = advance(executor, last_seq, inbox, now)
                if isinstance(task, AnsweredStep):
                    answered = self._answered(task, executor, last_seq, result)
                    if answered is None:
                        return None
                    result = answered
                held = mismatch(executor) if self._holds_runs else None
                if (
                    held is not None
                ):  # the history does not match this code: the run waits (docs/reference/contract.md §11)
                    self.closer(executor)
                    self.retry_later(task, f"the run is held: {held.message}", failure=held)
                    return None
                inline = started.inline
                if inline is not None and (task.lease.version == 1 or isinstance(task, AnsweredStep)):
                    # inline attempts that ran before a failure here run again when the task
                    # is retried: activities run at least once
                    # (while at least half the task's lease is left: the other half is for the
                    # rest of the batch and the write)
                    going = executor
                    result = inline.go_on(
                        executor,
                        result,
                        until=task.lease.until - self._lease / 2,
                        clock=self._store.clock,
                        watched=lambda: started.watched(task, going),
                        room_in=task.outcome.task.queue if isinstance(task, AnsweredStep) else None,
                        # in the ended attempt's thread; not after a lapsed lease (a chained
                        # attempt that blocks is then not repeated in place forever)
                        chained=isinstance(task, AnsweredStep) and task.lease.version == 1,
                    )
        except Exception as exc:  # noqa: BLE001 - not the workflow's code (see above): the task fails
            if executor is not None:
                self.closer(executor)
            self.retry_later(task, f"deciding it failed: {_describe(exc)}", exc)
            return None
        except BaseException:  # the watchdog's interrupt, or worse: the executor is dropped, so closed now
            if executor is not None:
                self.closer(executor)
            raise
        if executor.finished or result.new_history is not None:
            self.closer(executor)
        elif not result.new_events:
            self.cache.put(task.run_id, executor, last_seq)  # nothing to write: it stands where it was
        else:
            self._unwritten.put(task, executor, result.new_events[-1].sequence_number)  # cached once written
        return result

    def _give_back_unloaded(self, task: WorkflowTask, exc: Exception) -> bool:
        """The load of the task's round failed: give it back (``retry_later``)."""
        return self.retry_later(task, f"loading its run failed: {_describe(exc)}", exc)

    def retry_later(
        self, task: WorkflowTask, reason: str, exc: BaseException | None = None, *, failure: FailureInfo | None = None
    ) -> bool:
        """Fail ``task`` (not its run) for a reason outside its workflow code — the store, a bug
        of dex, code that blocked its task — and give it back to be claimed again after a
        backoff that grows with its claims (``TASK_RETRY``; the lease version counts them).
        Logged with the run id. False when the task could not be given back (the lease was lost,
        or the store is down: the lease then expires on its own, a retry all the same). With
        ``failure``, the run is held (:mod:`dex.app.workflows.held`) and keeps it as its ``task_failure``.
        An answered step, which no store holds, has its outcome written the ordinary way instead."""
        if isinstance(task, AnsweredStep):
            write_ordinarily(self._buffer, task, reason)
            return True
        self.holds += failure is not None
        return give_back(self._store, self._telemetry, self._rng, task, reason, exc, failure)

    def forget(self, timeout: float | None = None) -> None:
        """Close every executor this worker holds (the engine stops): in the calling thread, or,
        with ``timeout``, in a thread of their own for at most that long (code that blocks in a
        ``finally`` block, unwatched now, must not hold the stop up)."""
        self.cache.clear()
        self.closer.all(entry.executor for entry in self._unwritten.clear())
        if timeout is None:
            self.close_dropped()
            return
        closing = threading.Thread(target=self.close_dropped, name="dex-closing", daemon=True)
        closing.start()
        closing.join(timeout)
        if closing.is_alive():
            log.warning(
                "closing the dropped workflow executors did not end within %g s (workflow code blocks in a "
                "finally block); left to a thread of its own",
                timeout,
            )

    def written(self, task: WorkflowTask, applied: bool) -> None:
        """The buffer wrote our result for ``task``: keep its executor if the store applied it."""
        entry = self._unwritten.pop(task)
        if not applied and isinstance(task, AnsweredStep):
            write_ordinarily(self._buffer, task, "the store did not apply the step")
        if entry is None:
            return
        if applied:
            self.cache.put(task.run_id, entry.executor, entry.last_seq)
        else:
            self.closer(entry.executor)

    # -- transaction steps in groups (see the module docstring) ----------------------------------
    def _decided(self, round_: Round, task: WorkflowTask, result: WorkflowTaskResult, steps: StepGroups | None) -> None:
        """A result of the round: done, or parked at a step its next group runs."""
        entry = self._unwritten.get(task) if steps is not None else None
        # an answered step is written as it is (its write is what ends the activity's claim):
        # a transaction step it schedules becomes a task of its own
        parks = (
            steps is not None
            and entry is not None
            and not isinstance(task, AnsweredStep)
            and steps.waits(task, entry.executor, result)
        )
        with self._handed_lock:
            (round_.parked if parks else round_.done).append((task, result))

    def _go_on(self, round_: Round, started: Started) -> None:
        """The round's parked tasks go on: in the group threads, or here."""
        groups = started.groups
        if groups is None or not round_.parked:
            return self._run_steps(round_, started)
        apart = Round()
        with self._handed_lock:
            apart.parked, round_.parked = round_.parked, []
        if not groups.submit(lambda: self._run_apart(apart, started)):
            with self._handed_lock:  # written as they are: their steps become tasks
                round_.done.extend(apart.take())
        return None

    def _run_apart(self, round_: Round, started: Started) -> None:
        try:
            self._run_steps(round_, started)
        except BaseException:  # a bug of ours: the tasks being decided are retried after their leases
            log.exception("transaction steps in a group could not go on; their tasks are retried")
        finally:
            done = round_.take()
            if done:
                self._buffer.add_workflow_results(done)

    def _run_steps(self, round_: Round, started: Started) -> None:
        """Run the round's parked steps, group after group, until every task is done."""
        steps, watchdog = started.steps, started.watchdog
        while steps is not None and round_.parked:
            with self._handed_lock:
                batch, round_.parked = round_.parked, []
            entries = [(task, result, self._unwritten.get(task)) for task, result in batch]
            parked = [Parked(task=t, executor=e.executor, result=r) for t, r, e in entries if e is not None]
            with self._handed_lock:  # (none): written as they are
                round_.done.extend((t, r) for t, r, e in entries if e is None)
            for item, result in steps.run(parked, started.watched):
                task, executor = item.task, item.executor
                if result is None or (watchdog is not None and watchdog.abandoned(task)):
                    self._drop(task)  # no longer ours, or given up while its code blocked
                    continue
                if executor.finished or result.new_history is not None:
                    self._unwritten.pop(task)
                    self.closer(executor)
                elif result.new_events:
                    self._unwritten.put(task, executor, result.new_events[-1].sequence_number)
                self._decided(round_, task, result, steps)

    # -- answered steps (dex.app.workflows.answers) ----------------------------------------------------------
    def answer(self, outcome: ActivityOutcome, started: Started) -> bool:
        """An attempt of this engine ended: when this worker holds the run's executor, decide
        the step the outcome answers at once, in the calling thread (the attempt's, which has
        nothing else to do), and buffer its result, so that one write records both. False:
        write the outcome the ordinary way. Raises only what deciding raised past its own
        handling (a bug of dex): the caller then writes the outcome the ordinary way."""
        if not self._names or not self._answers(outcome.task.name, outcome.task.queue, started.inline):
            return False
        now = self._store.clock.now()
        cached = self.cache.take(outcome.task.run_id)  # the executor is this step's alone now
        taken = answered_step(outcome, cached, self._node_id, now, self._lease)
        if taken is None:
            if cached is not None:
                self.cache.put(outcome.task.run_id, cached.executor, cached.last_seq)
            return False
        step, given = taken
        began, watchdog = time.perf_counter(), started.watchdog
        try:
            result = self._decide(step, Preloaded(cached=cached, given=Given(loaded=given, at=now)), started)
        except BaseException:
            if watchdog is not None and watchdog.abandoned(step):  # its interrupt: see below
                self._drop(step)
                return True
            raise
        if watchdog is not None and watchdog.abandoned(step):
            # given back while its code blocked: its outcome went the ordinary way (retry_later)
            self._drop(step)
            return True
        if result is not None:
            self._buffer.add_workflow_results([(step, result)])
            outcome_kind = "progressed" if result.completion is None else result.completion.status.value.lower()
            self._telemetry.task_finished("workflow", step.workflow_name, outcome_kind, time.perf_counter() - began)
        return True

    def _answers(self, name: str, queue: str, inline: InlineActivities | None) -> bool:
        """Whether outcomes of activity ``name`` are answered here: always without inline
        activities; with them, for an activity known to be too slow to run inline, and for a
        quick one while its queue is full (as last read), which is why it ran as a task of its
        own. One whose duration is not known yet (its first attempts in this process) takes the
        ordinary path: its run's next steps are likely to run inline, in the worker's batched
        tasks, which cost less than a step answered in each attempt's thread (measured:
        answering them too took the engine-alone batch on a cold engine from ~1,240 to ~980/s).
        So does a quick one whose queue has room, for the same reason. But in a full queue the
        ordinary path's next step would not run inline either, and every step after it would go
        the same way; an answered step runs its next ones inline in the room its own task
        leaves (``eligible(room_in=...)``). Without that, a backlog that filled the queue once
        kept every run on the ordinary path as long as starts came faster than it drains
        (~525 workflows/s against ~1,600)."""
        if inline is None:
            return True
        took = inline.worker.durations.typical(name)
        if took is None:
            return False
        return took > inline.typical or not inline.queues.open(queue)

    def _answer_start(
        self, step: AnsweredStep, preloaded: Preloaded | None
    ) -> tuple[WorkflowExecutor, int, list[ev.HistoryEvent], list[InboxMessage]] | None:
        """What ``step`` starts from (as ``start_point`` says for a task): the executor
        ``answer`` took from the cache, and the step's one message. None (the outcome then goes
        the ordinary way) only if something other than ``answer`` asked."""
        cached = preloaded.cached if preloaded is not None else None
        loaded = preloaded.given.loaded if preloaded is not None else None
        if cached is None or not isinstance(loaded, WorkflowInput):
            write_ordinarily(self._buffer, step, "no executor of the run was at hand")
            return None
        return cached.executor, step.last_seq, [], loaded.inbox

    def _answered(
        self, step: AnsweredStep, executor: WorkflowExecutor, last_seq: int, result: WorkflowTaskResult
    ) -> WorkflowTaskResult | None:
        """The result of an answered step; None when the run did not take the outcome now
        (suspended, or ended in its history): the executor stays as it was, and the outcome
        goes the ordinary way."""
        if not result.new_events:
            self.cache.put(step.run_id, executor, last_seq)
            write_ordinarily(self._buffer, step, "the run does not take it now")
            return None
        return result.replaced(consumed=())  # its message was never in the inbox


def _describe(exc: BaseException) -> str:
    """``Type: message`` of a machinery error, for the log (a message that cannot be had is said so)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises still gets described
        text = "<message unavailable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _encoded_ahead(result: WorkflowTaskResult) -> WorkflowTaskResult:
    """The result, its block encoded now and carried on its events (else left to the flusher)."""
    try:
        return result.replaced(new_events=encode_ahead(result.new_events))
    except Exception:
        log.debug("could not encode the result of run %s ahead of its flush", result.run_id, exc_info=True)
        return result
