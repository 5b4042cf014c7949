"""Workers: claim tasks, execute them, hand the outcomes to the result buffer.

Each worker is a plain object whose ``poll_once()`` does one round; the engine's threads call
it in a loop and ``Engine.drain()`` calls it inline, which is what makes a whole engine
steppable from one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from dex.app.activity_context import ActivityContext, reset_activity_context, set_activity_context
from dex.app.buffer import ResultBuffer
from dex.app.leases import ActivityLeases
from dex.app.ports import (
    DEFAULT_ACTIVITY_LEASE,
    ActivityOutcome,
    ActivityTask,
    Loaded,
    Store,
    UnreadableHistoryError,
    WorkflowTask,
)
from dex.app.refusals import failed_result
from dex.app.registry import Registry
from dex.app.runner import Foreground
from dex.app.telemetry import Telemetry, TelemetryHub
from dex.app.tracing import NoTracing, Tracing
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import ApplicationError, NotRegisteredError, RunNotFoundError, SerializationError
from dex.domain.replay import WorkflowExecutor
from dex.domain.retry import RetryPolicy
from dex.domain.task import (
    InboxMessage,
    NewActivityTask,
    WorkflowTaskResult,
    advance,
    can_continue,
    continue_task,
    replay_history,
)
from dex.domain.values import FailureInfo
from dex.serialization.history import encode_block_ahead

if TYPE_CHECKING:
    from dex.app.inline import InlineActivities
    from dex.app.watchdog import Watchdog

log = logging.getLogger("dex.worker")

# an inline chain stops once its task has this many new events, so that one write stays bounded
_INLINE_EVENTS = 2000

# the backoff of a workflow task that failed for a reason other than its code (retry_later):
# 1 s, 2 s, 4 s ... at most 5 minutes, for as long as it takes (attempts are claims)
TASK_RETRY = RetryPolicy(
    initial_delay=timedelta(seconds=1), multiplier=2.0, max_delay=timedelta(minutes=5), max_attempts=2**31 - 1
)


class ExecutorCache:
    """Executors of recently advanced runs, so a run's next task applies only what is new.

    An entry is valid only for the history it was advanced to (``last_seq``); a task that
    finds the run's history elsewhere, or a result of ours the store discarded, drops it.
    Bounded (least recently used first out), because each entry holds live coroutines.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[WorkflowExecutor, int]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, run_id: str) -> tuple[WorkflowExecutor, int] | None:
        """Remove and return the executor cached for ``run_id`` and the sequence number it stands at."""
        with self._lock:
            return self._entries.pop(run_id, None)

    def put(self, run_id: str, executor: WorkflowExecutor, last_seq: int) -> None:
        evicted = []
        with self._lock:
            if self._capacity <= 0:
                evicted.append(executor)
            else:
                replaced = self._entries.pop(run_id, None)
                if replaced is not None and replaced[0] is not executor:
                    evicted.append(replaced[0])  # another executor of the run: dropped, so closed
                self._entries[run_id] = (executor, last_seq)
                while len(self._entries) > self._capacity:
                    evicted.append(self._entries.popitem(last=False)[1][0])
        for old in evicted:
            old.close()

    def positions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The sequence number each cached run's executor stands at (runs not cached are left out)."""
        with self._lock:
            return {run_id: self._entries[run_id][1] for run_id in run_ids if run_id in self._entries}

    def discard(self, run_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(run_id, None)
        if entry is not None:
            entry[0].close()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), OrderedDict()
        for executor, _seq in entries:
            executor.close()


# what poll_once hands execute: the executor taken from the cache, the loaded input, the time
_Preloaded = tuple[
    "tuple[WorkflowExecutor, int] | None",
    "tuple[list[ev.HistoryEvent], list[InboxMessage]] | Exception",
    datetime,
]


class _Round:
    """A round's tasks not yet started (each with its cached executor and input) and its
    results decided so far: shared, so the watchdog can hand them to another thread."""

    def __init__(self) -> None:
        self.jobs: deque[
            tuple[WorkflowTask, tuple[WorkflowExecutor, int] | None, tuple[Loaded, datetime]]
        ] = deque()
        self.done: list[tuple[WorkflowTask, WorkflowTaskResult]] = []


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
    ) -> None:
        self._store, self._registry, self._converter, self._buffer = store, registry, converter, buffer
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._node_id, self._lease, self._batch_size = node_id, lease, batch_size
        self._rng = random.Random()  # jitter of retry_later's backoff only
        self._names = frozenset(registry.workflows)
        self.worked_at = float("-inf")  # time.monotonic() of the end of the last round that ran tasks
        self.claimed_full = False  # the last round's claim got all it asked for: more may wait
        self.cache = ExecutorCache(cache_size)
        # keyed by claim (task id, lease version): a node may hold two claims of one task
        self._unwritten: dict[tuple[int, int], tuple[WorkflowExecutor, int]] = {}
        self._unwritten_lock = threading.Lock()
        # tasks claimed for us by a completion ("complete, then claim"), waiting to be run, each
        # with its input when the completion loaded it too (and the time it was loaded at)
        self._handed: list[tuple[WorkflowTask, tuple[Loaded, datetime] | None]] = []
        self._handed_lock = threading.Lock()
        self._rounds: dict[int, _Round] = {}  # by thread: the round each thread is running
        # notices workflow code that blocks its task (set by a started engine, dex.app.watchdog)
        self.watchdog: Watchdog | None = None
        # first attempts of short activities run inside the task (set by a started engine)
        self.inline: InlineActivities | None = None
        # the application's calls in flight, which the worker lets go first (runner.Foreground)
        self.foreground = Foreground(pause=0)

    @property
    def names(self) -> frozenset[str]:
        return self._names

    @property
    def lease(self) -> timedelta:
        return self._lease

    def room(self) -> int:
        """How many more tasks may be handed to this worker (up to four rounds' worth wait)."""
        with self._handed_lock:
            return max(0, 4 * self._batch_size - len(self._handed))

    def idle_for(self) -> float:
        """Seconds since this worker last ran a task (infinite if it never did)."""
        return time.monotonic() - self.worked_at

    def backlog(self) -> int:
        """How many handed tasks wait for a round."""
        with self._handed_lock:
            return len(self._handed)

    def hand(
        self, tasks: Sequence[WorkflowTask], loaded: Sequence[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        """Tasks already claimed for this worker: the next round runs them without a claim, and,
        for those whose input came along (``loaded`` at ``now``), without a load."""
        inputs: Sequence[tuple[Loaded, datetime] | None] = (
            [(item, now) for item in loaded] if loaded and now is not None else [None] * len(tasks)
        )
        with self._handed_lock:
            self._handed.extend(zip(tasks, inputs, strict=True))

    def poll_once(self, claim: bool = True) -> int:
        """Execute up to one batch of workflow tasks (handed ones first, then, with ``claim``,
        claimed ones); return how many ran."""
        if not self._names:
            return 0
        with self._handed_lock:
            handed, self._handed = self._handed[: self._batch_size], self._handed[self._batch_size :]
        tasks = [task for task, _input in handed]
        self.claimed_full = False
        if claim and len(tasks) < self._batch_size:
            now = self._store.clock.now()
            limit = self._batch_size - len(tasks)
            try:
                claimed = self._store.claim_workflow_tasks(self._names, self._node_id, now, self._lease, limit)
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
        # else whole histories
        now = self._store.clock.now()
        cached = [self.cache.take(task.run_id) for task in tasks]
        # the round's results go to the buffer together: its flush writes them in one
        # transaction, instead of the first alone and the rest after it
        round_ = _Round()
        try:
            requests = [
                (task, entry[1] if entry is not None else 0)
                for (task, given), entry in zip(handed, cached, strict=True)
                if given is None
            ]
            fresh: Iterator[Loaded] = iter([])
            if requests:
                try:
                    fresh = iter(self._store.load_workflow_tasks(requests, now))
                except Exception as exc:  # noqa: BLE001 - the store failed the load: the tasks, not the runs
                    fresh = self._give_back_unloaded([task for task, _after in requests], exc)
            for (task, given), entry in zip(handed, cached, strict=True):
                round_.jobs.append((task, entry, given if given is not None else (next(fresh), now)))
        except BaseException:
            # a dropped executor is closed at once, replay-silent (SPEC §8): left to the garbage
            # collector, its code's finally blocks would run as if live
            close_all(entry[0] for entry in cached if entry is not None)
            raise
        ident = threading.get_ident()
        with self._handed_lock:
            self._rounds[ident] = round_  # the watchdog may hand the rest over to another thread
        try:
            while True:
                with self._handed_lock:
                    if not round_.jobs:
                        break
                    task, entry, (item, loaded_at) = round_.jobs.popleft()
                started = time.perf_counter()
                result = self.execute(task, preloaded=(entry, item, loaded_at))
                if result is not None:
                    if self.foreground.busy() and result.new_events:
                        # the flusher writes the round in one go without stepping aside: its
                        # encoding is done here, between tasks, while the application's call waits
                        _encode_ahead(result)
                    with self._handed_lock:
                        round_.done.append((task, result))
                    outcome = "progressed" if result.completion is None else result.completion.status.value.lower()
                    self._telemetry.task_finished(
                        "workflow", task.workflow_name, outcome, time.perf_counter() - started
                    )
                self.foreground.step_aside()  # an application's call waiting for the store goes first
        finally:
            with self._handed_lock:
                self._rounds.pop(ident, None)
                left, done = list(round_.jobs), round_.done
                round_.jobs.clear()
                round_.done = []
            close_all(entry[0] for _task, entry, _input in left if entry is not None)  # dropped: closed now
            if done:  # also when a later task of the round raised: what is decided is written
                self._buffer.add_workflow_results(done)
        self.worked_at = time.monotonic()
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
            left, done = list(round_.jobs), round_.done
            round_.jobs.clear()
            round_.done = []
            self._handed[:0] = [(task, given) for task, _entry, given in left]
        for task, entry, _given in left:
            if entry is not None:
                self.cache.put(task.run_id, *entry)
        if done:
            self._buffer.add_workflow_results(done)
        return len(left)

    def execute(self, task: WorkflowTask, preloaded: _Preloaded | None = None) -> WorkflowTaskResult | None:
        """Decide ``task``; None when there is nothing to write: its run no longer exists
        (retention took it), the task failed for a reason outside its workflow code and was
        given back to be retried (:meth:`retry_later`), or the watchdog gave the task back while
        its workflow code blocked (the result is discarded).

        Workflow code never fails a task: whatever it raises (or a non-determinism) is caught
        by the core and becomes the run's ``RunCompleted(FAILED)`` in the result. So an
        exception that escapes loading, replaying or advancing is the machinery's — the store
        unreachable, a bug of dex — and fails only the task (SPEC §8), which is retried with
        a backoff; a bug that recurs on every attempt is retried (and logged) every 5 minutes
        at most, and the run waits, FAILED by nothing but its own code."""
        watchdog = self.watchdog
        if watchdog is None:
            return self._decide(task, preloaded)
        try:
            result = self._decide(task, preloaded)
        finally:
            abandoned = watchdog.abandoned(task)
        if abandoned:
            self._drop(task)
            return None
        return result

    def _watched(self, task: WorkflowTask, executor: WorkflowExecutor | None) -> AbstractContextManager[None]:
        """Around workflow code: the watchdog notices if it runs past the task's deadline."""
        watchdog = self.watchdog
        return watchdog.watch(task, executor) if watchdog is not None else nullcontext()

    def _drop(self, task: WorkflowTask) -> None:
        """Close what a task given back by the watchdog left behind (its executor)."""
        with self._unwritten_lock:
            entry = self._unwritten.pop((task.task_id, task.lease.version), None)
        if entry is not None:
            entry[0].close()
        self.cache.discard(task.run_id)

    def _decide(self, task: WorkflowTask, preloaded: _Preloaded | None = None) -> WorkflowTaskResult | None:
        now = preloaded[2] if preloaded is not None else self._store.clock.now()
        executor: WorkflowExecutor | None = None
        try:
            executor, last_seq, history, inbox = self._load(task, now, preloaded)
        except RunNotFoundError:
            log.info(
                "dropping workflow task %s: run %s no longer exists",
                task.task_id,
                task.run_id,
                extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
            )
            return None
        except _GivenBack:  # its round's load failed, and it was given back already
            return None
        except UnreadableHistoryError as exc:
            log.error("%s; the run fails", exc, extra={"run_id": task.run_id, "workflow_name": task.workflow_name})
            failure = FailureInfo(type="UnreadableHistoryError", message=str(exc), terminal=True)
            return failed_result(task.run_id, exc.last_seq, exc.message_ids, now, failure)
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
                    with self._watched(task, None):
                        executor = replay_history(
                            self._registry.workflows[task.workflow_name],
                            task.run_id,
                            history,
                            self._converter,
                            activities=self._registry.find_activity,
                            workflows=self._registry.find_workflow,
                        )
                    if self.watchdog is not None and self.watchdog.gave_up(task):
                        executor.abandon()  # it blocked in replay: nothing of the new block may run
                with self._watched(task, executor):
                    result = advance(executor, last_seq, inbox, now)
                if self.inline is not None and task.lease.version == 1:
                    # inline attempts that ran before a failure here run again when the task
                    # is retried: activities run at least once
                    result = self._run_inline(self.inline, task, executor, result)
        except Exception as exc:  # noqa: BLE001 - not the workflow's code (see above): the task fails
            if executor is not None:
                executor.close()
            self.retry_later(task, f"deciding it failed: {_describe(exc)}", exc)
            return None
        except BaseException:  # the watchdog's interrupt, or worse: the executor is dropped, so closed now
            if executor is not None:
                executor.close()
            raise
        if executor.finished or result.new_history is not None:
            executor.close()
        elif not result.new_events:
            self.cache.put(task.run_id, executor, last_seq)  # nothing to write: it stands where it was
        else:
            # cached only once the store has applied the result: until then another node may
            # redo this task and record different side effects at the same sequence numbers
            with self._unwritten_lock:
                self._unwritten[(task.task_id, task.lease.version)] = (executor, result.new_events[-1].sequence_number)
        return result

    def _give_back_unloaded(self, tasks: Sequence[WorkflowTask], exc: Exception) -> Iterator[Loaded]:
        """The load of a round failed: give its tasks back (``retry_later``) while the store takes
        them; once it does not, the rest lapse with their leases (a retry all the same, without
        a call per task to a store that is down). Yields, per task, the error to skip it by."""
        giving_back = True
        for task in tasks:
            if giving_back:
                giving_back = self.retry_later(task, f"loading its run failed: {_describe(exc)}", exc)
            yield _GivenBack(task.task_id)

    def _run_inline(
        self, inline: InlineActivities, task: WorkflowTask, executor: WorkflowExecutor, result: WorkflowTaskResult
    ) -> WorkflowTaskResult:
        """Go on with the first attempts of the activities the task scheduled that may run here
        (:mod:`dex.app.inline`), step after step, while at least half the task's lease is left
        (the other half is for the rest of the batch and the write)."""
        budget_ends = task.lease.until - self._lease / 2
        tried: set[int] = set()
        while (
            not executor.closed  # the watchdog gave the task up: no further attempt runs for it
            and can_continue(executor, result)
            and self._store.clock.now() < budget_ends
            and len(result.new_events) < _INLINE_EVENTS
        ):
            outcomes: list[ev.ActivityTaskCompleted | ev.ActivityTaskFailed] = []
            retries: list[NewActivityTask] = []
            for spec in result.activity_tasks:
                if spec.created_seq in tried or not inline.eligible(spec):
                    continue
                tried.add(spec.created_seq)
                message, retry = inline.run(spec, self._store.clock.now())
                if message is not None:
                    outcomes.append(message)
                if retry is not None:
                    retries.append(retry)
            if not outcomes and not retries:
                break
            with self._watched(task, executor):
                result = continue_task(executor, result, outcomes, retries, self._store.clock.now())
            if not outcomes:
                break
        return result

    def retry_later(self, task: WorkflowTask, reason: str, exc: BaseException | None = None) -> bool:
        """Fail ``task`` (not its run) for a reason outside its workflow code — the store, a bug
        of dex, code that blocked its task — and give it back to be claimed again after a
        backoff that grows with its claims (``TASK_RETRY``; the lease version counts them).
        Logged with the run id. False when the task could not be given back (the lease was lost,
        or the store is down: the lease then expires on its own, a retry all the same)."""
        delay = TASK_RETRY.next_delay(max(1, task.lease.version), self._rng) or TASK_RETRY.max_delay
        log.warning(
            "workflow task %s of run %s failed and is retried in %.1f s: %s",
            task.task_id,
            task.run_id,
            delay.total_seconds(),
            reason,
            exc_info=exc is not None and not isinstance(exc, ConnectionError),
            extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
        )
        self._telemetry.task_finished("workflow", task.workflow_name, "retried", 0.0)
        try:
            now = self._store.clock.now()
            return self._store.retry_workflow_tasks([(task, now + delay)], now)[0]
        except Exception:  # noqa: BLE001 - the store is down: the lease expires on its own
            log.info("could not give back workflow task %s; its lease will expire", task.task_id, exc_info=True)
            return False

    def forget(self) -> None:
        """Close every executor this worker holds (the engine stops)."""
        self.cache.clear()
        with self._unwritten_lock:
            unwritten, self._unwritten = list(self._unwritten.values()), {}
        for executor, _seq in unwritten:
            executor.close()

    def written(self, task: WorkflowTask, applied: bool) -> None:
        """The buffer wrote our result for ``task``: keep its executor if the store applied it."""
        with self._unwritten_lock:
            entry = self._unwritten.pop((task.task_id, task.lease.version), None)
        if entry is None:
            return
        executor, seq = entry
        if applied:
            self.cache.put(task.run_id, executor, seq)
        else:
            executor.close()

    def _load(
        self, task: WorkflowTask, now: datetime, preloaded: _Preloaded | None
    ) -> tuple[WorkflowExecutor | None, int, list[ev.HistoryEvent], list[InboxMessage]]:
        """The cached executor if the stored history still ends where it stands, else the full history."""
        if preloaded is not None:
            cached, item = preloaded[0], preloaded[1]
        else:
            cached = self.cache.take(task.run_id)
            try:
                item = self._store.load_workflow_tasks([(task, cached[1] if cached else 0)], now)[0]
            except BaseException:
                if cached is not None:
                    cached[0].close()  # dropped: closed at once, not by the garbage collector (SPEC §8)
                raise
        if isinstance(item, Exception):
            if cached is not None:
                cached[0].close()
            raise item
        if cached is not None:
            executor, cached_seq = cached
            tail, inbox = item
            if len(tail) == 1 and tail[0].sequence_number == cached_seq:
                return executor, cached_seq, [], inbox
            executor.close()  # someone else moved the run on (or our last result was refused)
        history, inbox = item
        if not history or history[0].sequence_number != 1:
            # a tail, loaded for an executor that does not stand there now: it was closed just
            # above, or it left the bounded cache after the claim that loaded the tail for it
            # (Claim.after_seqs); a history loaded from the start is used as it is
            history, inbox = self._store.load_workflow_task(task, now)
        return None, history[-1].sequence_number, history, inbox


class _GivenBack(Exception):
    """Stands for the input of a task whose round failed to load it: the task was given back."""


def _describe(exc: BaseException) -> str:
    """``Type: message`` of a machinery error, for the log (a message that cannot be had is said so)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises still gets described
        text = "<message unavailable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _encode_ahead(result: WorkflowTaskResult) -> None:
    """Encode the result's history block for the flusher now; a block that cannot be encoded
    is left to the flusher, which tells the task or run it belongs to (see the buffer)."""
    try:
        encode_block_ahead(result.new_events)
    except Exception:  # noqa: BLE001 - only a head start: the flush encodes again, and reports it
        log.debug("could not encode the result of run %s ahead of its flush", result.run_id, exc_info=True)


def close_all(executors: Iterable[WorkflowExecutor]) -> None:
    """Close dropped executors (each silently; one that fails to close does not stop the rest)."""
    for executor in executors:
        try:
            executor.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the executor is gone either way
            log.exception("closing the executor of run %s failed", executor.run_id)


class AsyncRunner:
    """An event loop in its own thread, owned by the worker, on which async activities run.

    asyncio lets ``KeyboardInterrupt`` and ``SystemExit`` out of a task through ``run_forever``,
    which would end the loop's thread and leave every later ``async def`` attempt waiting
    forever. So the activity's coroutine runs wrapped: any ``BaseException`` it raises travels
    to the caller as the payload of an ordinary exception and is raised there again, as the
    attempt's failure. Should the thread die anyway, it is logged and the next attempt starts a
    new loop; an attempt waiting on the dead loop fails instead of waiting forever.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro: Any) -> Any:
        with self._lock:
            if self._thread is not None and not self._thread.is_alive():
                log.error("the asyncio activity thread had died; starting a new one")
                self._loop, self._thread = None, None
            if self._loop is None or self._thread is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=_run_loop, args=(self._loop,), name="dex-async-activities", daemon=True
                )
                self._thread.start()
            loop, thread = self._loop, self._thread
        future = asyncio.run_coroutine_threadsafe(_carried(coro), loop)
        while not future.done():
            concurrent.futures.wait([future], timeout=1.0)
            if not future.done() and not thread.is_alive():
                future.cancel()
                raise RuntimeError("the asyncio activity thread died while the attempt ran")
        try:
            return future.result()
        except _Carried as carried:
            raise carried.exc from None

    @property
    def alive(self) -> bool:
        """False only when the loop's thread was started and has died."""
        thread = self._thread
        return thread is None or thread.is_alive()

    def close(self, timeout: float = 5) -> None:
        """Stop the loop. Coroutines still running (attempts a stopping engine abandons) are
        cancelled, so the threads waiting for them go on; a loop that a coroutine keeps from
        stopping within ``timeout`` seconds is left to its daemon thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(_cancel_all_and_stop, loop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the asyncio loop of async activities did not stop within %g s; it is left running", timeout)
            return
        loop.close()


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        loop.stop()
        return
    for task in tasks:
        task.cancel()
    asyncio.gather(*tasks, return_exceptions=True).add_done_callback(lambda _f: loop.stop())


class _Carried(Exception):
    """A ``BaseException`` of an async activity, carried out of the event loop as an Exception."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


async def _carried(coro: Any) -> Any:
    try:
        return await coro
    except Exception:
        raise
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/SystemExit would stop the loop
        raise _Carried(exc) from None


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    except BaseException:  # noqa: BLE001 - logged loudly; the next attempt starts a new loop
        log.critical("the asyncio activity thread died", exc_info=True)


class Durations:
    """How long the last few attempts of each activity took (seconds), for inline execution."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            seen = self._seen.get(name)
            if seen is None:
                seen = self._seen[name] = deque(maxlen=self._keep)
            seen.append(seconds)

    def typical(self, name: str) -> float | None:
        """The median of the last attempts of ``name`` (wall time, so an attempt that waited for
        the GIL counts long: the median sees past those); None before its first one ended."""
        with self._lock:
            seen = self._seen.get(name)
            return statistics.median(seen) if seen else None


class ActivityWorker:
    """Runs activity attempts and turns each into a result, a final failure or a retry."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        converter: PayloadConverter,
        buffer: ResultBuffer,
        node_id: str,
        *,
        rng: random.Random,
        async_runner: AsyncRunner,
        batch_size: int = 16,
        telemetry: Telemetry | None = None,
        tracing: Tracing | None = None,
        lease: timedelta = DEFAULT_ACTIVITY_LEASE,
    ) -> None:
        self._store, self._registry, self._converter, self._buffer = store, registry, converter, buffer
        self.leases = ActivityLeases(lease)  # the attempts this worker runs under a lease
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._node_id, self._rng, self._async, self._batch_size = node_id, rng, async_runner, batch_size
        self._names = frozenset(registry.activities)
        self._rng_lock = threading.Lock()
        self.durations = Durations()

    @property
    def names(self) -> frozenset[str]:
        return self._names

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def lease(self) -> timedelta:
        """The short lease its claims take (at most each task's ``lock_timeout``)."""
        return self.leases.lease

    def claim(self, limit: int | None = None) -> list[ActivityTask]:
        if not self._names:
            return []
        limit = self._batch_size if limit is None else min(limit, self._batch_size)
        if limit <= 0:
            return []
        tasks = self._store.claim_activity_tasks(
            self._names, self._node_id, self._store.clock.now(), self.leases.lease, limit
        )
        if tasks:
            self._telemetry.tasks_claimed("activity", len(tasks))
        return tasks

    def poll_once(self, executor: Executor | None = None, on_done: Callable[[], None] | None = None) -> int:
        """Claim a batch; run each attempt inline, or on ``executor`` when one is given."""
        tasks = self.claim()
        for task in tasks:
            if executor is None:
                self.run(task)
            else:
                future: Future[None] = executor.submit(self.run, task)
                if on_done is not None:
                    future.add_done_callback(lambda _f: on_done())
        return len(tasks)

    def run(self, task: ActivityTask) -> None:
        """Run one attempt and buffer its outcome. Never raises: whatever happens, an outcome is
        buffered, or the task is left to its lease with a log line (a pool thread's exception
        would be swallowed by its future, and the task silently lost until its lease ends)."""
        started = time.perf_counter()
        with self.leases.running(task, self._store.clock.now()):  # its lease is kept alive meanwhile
            outcome = self.execute(task)
        try:
            self.finished(outcome, time.perf_counter() - started)  # first: the next step may ask its duration
        except BaseException:  # noqa: BLE001 - a telemetry sink or a log handler failed: the outcome still counts
            log.exception("could not record the end of activity %s of run %s", task.name, task.run_id)
        try:
            self._buffer.add_activity_outcome(outcome)
        except BaseException:  # noqa: BLE001 - nothing left to do but let the lease expire: it is retried then
            log.exception(
                "could not buffer the outcome of activity %s of run %s (attempt %d); it is retried when its lease"
                " expires",
                task.name,
                task.run_id,
                task.attempt,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )

    def finished(self, outcome: ActivityOutcome, seconds: float) -> None:
        """Record an attempt that ended (here or inline): telemetry, its duration, a log line."""
        task = outcome.task
        self.durations.record(task.name, seconds)
        kind = "retried" if outcome.retry_at is not None else "failed" if outcome.failure is not None else "completed"
        self._telemetry.task_finished("activity", task.name, kind, seconds)
        if outcome.failure is not None:
            log.info(
                "activity %s of run %s, attempt %d: %s (%s)",
                task.name,
                task.run_id,
                task.attempt,
                kind,
                outcome.failure.message,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )

    def execute(self, task: ActivityTask, heartbeat: Callable[[], bool] | None = None) -> ActivityOutcome:
        """Run one attempt; ``heartbeat`` replaces the lease extension (an inline attempt has no lease).

        Never raises: any ``BaseException`` of the activity's code (``SystemExit``,
        ``KeyboardInterrupt`` too) is a failed attempt naming its type, retried under the retry
        policy, and so is a failure of dex's own handling of the attempt."""
        try:
            return self._execute(task, heartbeat)
        except BaseException as exc:  # noqa: BLE001 - see above: no engine thread dies of an attempt
            log.exception(
                "activity %s of run %s, attempt %d: its outcome could not be made; the attempt counts as failed",
                task.name,
                task.run_id,
                task.attempt,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )
            failure = described_failure(exc)
            try:
                return self._retry_or_fail(task, failure, None)
            except BaseException:  # noqa: BLE001 - not even a retry could be computed: a final failure
                return ActivityOutcome(task=task, failure=failure)

    def _execute(self, task: ActivityTask, heartbeat: Callable[[], bool] | None) -> ActivityOutcome:
        if task.attempt > task.retry_policy.max_attempts:
            # the previous holder's lease expired on the last allowed attempt: that attempt counts
            # as failed (its outcome is unknown), and the policy allows no further one
            failure = FailureInfo(
                type="LeaseExpiredError",
                message=f"attempt {task.attempt - 1} of activity {task.name!r} lost its lease (its worker died or hung)"
                f" and the retry policy allows {task.retry_policy.max_attempts} attempt(s)",
            )
            return ActivityOutcome(task=task, failure=failure)
        context = ActivityContext(
            run_id=task.run_id,
            activity_name=task.name,
            attempt=task.attempt,
            heartbeat_fn=heartbeat if heartbeat is not None else lambda: self._heartbeat(task),
        )
        token = set_activity_context(context)
        try:
            try:
                definition = self._registry.activity(task.name)
                signature = definition.signature
                signature.check_arity(len(task.input), f"activity {task.name!r}")
                args = [self._converter.decode(p, signature.hint_for(i)) for i, p in enumerate(task.input)]
            except (NotRegisteredError, SerializationError, TypeError) as exc:
                # bad input does not get better by retrying
                return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))
            attributes: dict[str, str | int] = {
                "dex.run_id": task.run_id,
                "dex.activity": task.name,
                "dex.attempt": task.attempt,
            }
            try:
                with self._tracing.span(f"dex.activity {task.name}", task.trace_context, attributes):
                    value = definition.fn(*args)
                    if definition.is_async or asyncio.iscoroutine(value):
                        value = self._async.run(value)
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... of user code are failures too
                return self._failed(task, exc)
            try:
                return ActivityOutcome(task=task, result=self._converter.encode(value))
            except SerializationError as exc:
                return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))
        finally:
            reset_activity_context(token)

    def _heartbeat(self, task: ActivityTask) -> bool:
        """The attempt's ``heartbeat()``: moves its deadline (``lock_timeout`` from now) and
        extends its lease at once; False once the lease is lost or given up."""
        return self.leases.heartbeat(task, self._store.clock.now()) and self._buffer.heartbeat(task)

    def keep_leases(self) -> int:
        """A step of the engine's activity thread: queue the extensions of the running attempts'
        leases when due, and fail the attempts past their ``lock_timeout`` (leases.py)."""
        decided = self.leases.step(self._store.clock.now())
        for task in decided.extend:
            self._buffer.heartbeat(task)
        for task in decided.overdue:
            log.warning(
                "activity %s of run %s, attempt %d: still running after its lock_timeout (%s); failed,"
                " and whatever it returns will be discarded",
                task.name,
                task.run_id,
                task.attempt,
                task.lock_timeout,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )
            self._buffer.add_activity_outcome(self.timed_out(task))
        return len(decided.extend) + len(decided.overdue)

    def timed_out(self, task: ActivityTask) -> ActivityOutcome:
        """The outcome of an attempt that ran past its deadline: a failure, retried as its policy says."""
        failure = FailureInfo(
            type="LockTimeoutError",
            message=f"attempt {task.attempt} of activity {task.name!r} ran longer than its lock_timeout"
            f" ({task.lock_timeout}) since it started or last called heartbeat()",
        )
        with self._rng_lock:
            delay = task.retry_policy.next_delay(task.attempt, self._rng)
        retry_at = None if delay is None else self._store.clock.now() + delay
        seconds = task.lock_timeout.total_seconds()
        self._telemetry.task_finished("activity", task.name, "failed" if retry_at is None else "retried", seconds)
        return ActivityOutcome(task=task, failure=failure, retry_at=retry_at)

    def _failed(self, task: ActivityTask, exc: BaseException) -> ActivityOutcome:
        try:
            failure = FailureInfo.from_exception(exc)
            retry_after = exc.retry_after if isinstance(exc, ApplicationError) else None
        except BaseException:  # noqa: BLE001 - describing it raised (a hostile __str__): a failure all the same
            failure, retry_after = undescribed_failure(exc), None
        return self._retry_or_fail(task, failure, retry_after)

    def _retry_or_fail(self, task: ActivityTask, failure: FailureInfo, retry_after: timedelta | None) -> ActivityOutcome:
        """The outcome of a failed attempt: final when terminal or out of attempts, else a retry."""
        if failure.terminal:
            return ActivityOutcome(task=task, failure=failure)
        now = self._store.clock.now()
        with self._rng_lock:
            delay = task.retry_policy.next_delay(task.attempt, self._rng)
        if delay is None:
            return ActivityOutcome(task=task, failure=failure)
        if retry_after is not None:
            delay = retry_after
        return ActivityOutcome(task=task, failure=failure, retry_at=now + delay)


def described_failure(exc: BaseException, *, terminal: bool | None = None) -> FailureInfo:
    """``FailureInfo.from_exception(exc)``, or, if describing ``exc`` raised, :func:`undescribed_failure`."""
    try:
        return FailureInfo.from_exception(exc, terminal=terminal)
    except BaseException:  # noqa: BLE001 - a hostile __str__/__repr__ must not lose the failure
        return undescribed_failure(exc, terminal=bool(terminal))


def undescribed_failure(exc: BaseException, *, terminal: bool = False) -> FailureInfo:
    """A failure for an exception that could not be described (its ``__str__`` or ``__repr__``
    raised, or describing it failed otherwise): its type name only, never ``str(exc)``."""
    try:
        name = type(exc).__name__
        if not isinstance(name, str):
            raise TypeError(name)
    except BaseException:  # noqa: BLE001 - a type whose name cannot be read: still a failure
        name = "BaseException"
    return FailureInfo(type=name, message=f"<{name}: the exception could not be described>", terminal=terminal)
