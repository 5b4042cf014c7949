"""The activity worker: claims activity tasks, runs their attempts, hands each outcome (a
result, a final failure or a retry) to the result buffer.

Like every worker it is a plain object whose ``poll_once()`` does one round; the engine's
threads call it in a loop and ``Engine.drain()`` calls it inline, which is what makes a whole
engine steppable from one thread. The engine's pool runs single attempts with ``run()``, and
inline attempts (:mod:`dex.app.workflows.inline`) call ``execute()``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from dex.app.activities.attempts import Durations, Retries, described_failure, lease_expired, span_attributes
from dex.app.activities.event_loop import AsyncRunner
from dex.app.activities.lease_keeper import LeaseKeeper
from dex.app.activities.leases import ActivityLeases
from dex.app.activities.streams import ActivityStreams
from dex.app.activities.transaction_steps import TransactionAttempts, Written
from dex.app.definitions.activity_context import ActivityContext, reset_activity_context, set_activity_context
from dex.app.definitions.registry import Registry
from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import DEFAULT_ACTIVITY_LEASE, ActivityOutcome, ActivityTask, Store
from dex.app.ports.telemetry import Telemetry, TelemetryHub
from dex.app.ports.tracing import NoTracing, Tracing
from dex.domain.definitions import ActivityDefinition, PayloadConverter
from dex.domain.errors import NotRegisteredError, SerializationError
from dex.domain.steps import decode_arguments
from dex.domain.values import FailureInfo, Payload

log = logging.getLogger("dex.worker")


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
        answered: Callable[[ActivityOutcome], bool] | None = None,
        completed_directly: Callable[[], None] | None = None,
        durations: Durations | None = None,
    ) -> None:
        self._store, self._registry, self._converter, self._buffer = store, registry, converter, buffer
        self.leases = ActivityLeases(lease)  # the attempts this worker runs under a lease
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._node_id, self._async, self._batch_size = node_id, async_runner, batch_size
        self._names = frozenset(registry.activities)
        retries = Retries(lambda: self._store.clock.now(), rng, self._telemetry)
        self._failed, self._retry_or_fail = retries.failed, retries.retry_or_fail
        self.timed_out, self.given_back = retries.timed_out, retries.given_back
        self._keeper = LeaseKeeper(store, buffer, self.leases, self.timed_out)
        # how long recent attempts took (what runs inline); a simulation passes fixed ones
        self.durations = durations if durations is not None else Durations()
        self._transactions = TransactionAttempts(
            store, converter, async_runner.run, self._failed, self.durations.record, self.given_back
        )
        self._streams = ActivityStreams(store, converter)  # dex.activity_context().write_stream
        # called after a transaction step wrote its completion itself: a workflow task became due
        self._completed_directly = completed_directly
        # takes an outcome as the step it answers, while the engine runs (dex.app.workflows.answers);
        # False: the outcome is buffered as usual
        self._answered = answered

    @property
    def stuck_step(self) -> str | None:
        """A transaction step the store failed many times in a row, described; None while
        there is none (:attr:`dex.app.activities.transaction_steps.TransactionAttempts.stuck`)."""
        return self._transactions.stuck

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
        outcome: ActivityOutcome | Written
        if self.is_transaction(task.name):
            # it holds its task's row lock instead of a lease kept alive (transaction_steps.py)
            outcome = self.attempt(task)
        else:
            with self.leases.running(task, self._store.clock.now()):  # its lease is kept alive meanwhile
                outcome = self.execute(task)
        if isinstance(outcome, Written):
            self._written(outcome, time.perf_counter() - started)
            return
        self._deliver(outcome, time.perf_counter() - started)

    def awaits(self, name: str) -> bool:
        """Whether a started engine's attempts of ``name`` are awaited on the event loop
        (:meth:`run_awaited`): an ``async def`` activity that is not a transaction step."""
        definition = self._registry.find_activity(name)
        return definition is not None and definition.is_async and definition.isolation is None

    def run_awaited(self, task: ActivityTask, then: Callable[[Callable[[bool], None]], object]) -> None:
        """Start an attempt of an ``async def`` activity on the event loop, where it holds no
        thread while it awaits (I/O-bound attempts by the thousand cost a thread each
        otherwise). When its coroutine has ended, ``then`` is given the rest of the attempt,
        what :meth:`run` does after the code: to be called on a thread that may block (it may
        decide the step the outcome answers and run that step's next activities inline), never
        on the loop's. Raises only when the loop could not take the attempt; the caller then
        leaves the task to its lease. The rest takes ``answer``: False records and buffers the
        outcome without deciding anything, which any thread may do."""
        started = time.perf_counter()
        running = ExitStack()
        running.enter_context(self.leases.running(task, self._store.clock.now()))

        def ended(future: Future[ActivityOutcome]) -> None:
            try:
                outcome = future.result()
            except BaseException as exc:  # noqa: BLE001 - cancelled (its lease lost, the engine stopping) or its loop died
                outcome = self._failed(task, exc)
            seconds = time.perf_counter() - started
            running.close()
            try:
                then(lambda answer: self._deliver(outcome, seconds, answer))
            except BaseException:  # a future's callback that raises is only logged by asyncio
                log.exception(
                    "the end of activity %s of run %s was lost; its lease brings it back", task.name, task.run_id
                )

        # told at once, and for good: the future ends (and the attempt with it) as it is
        # cancelled, while the coroutine may still be reading cancel_requested in its cleanup
        told = threading.Event()
        coro = self._awaited(task, told.is_set)
        try:
            future = self._async.start(coro, ended)
        except BaseException:
            coro.close()
            running.close()
            raise

        def cancel() -> None:
            told.set()
            future.cancel()

        self.leases.on_cancel(task, cancel)

    async def _awaited(self, task: ActivityTask, told: Callable[[], bool]) -> ActivityOutcome:
        """An attempt of an ``async def`` activity on the event loop: what :meth:`attempt` does in
        a thread. Its context is set in the loop's task, which has a context of its own."""
        try:
            ready = self._ready(task, None, told)
            if isinstance(ready, ActivityOutcome):
                return ready
            set_activity_context(ready)
            decoded = self._decode(task)
            if isinstance(decoded, ActivityOutcome):
                return decoded
            definition, args = decoded
            try:
                with self._tracing.span(f"dex.activity {task.name}", task.trace_context, span_attributes(task)):
                    value = await definition.fn(*args)
            except BaseException as exc:  # noqa: BLE001 - CancelledError, SystemExit ... of user code are failures too
                return self._failed(task, exc)
            return self._outcome_of(task, value)
        except BaseException as exc:  # noqa: BLE001 - a failure of dex's own handling of the attempt
            return self._unhandled(task, exc)

    def _deliver(self, outcome: ActivityOutcome, seconds: float, answer: bool = True) -> None:
        """Record an attempt that ended and hand its outcome on: as the step it answers (unless
        not ``answer``), else to the buffer. Never raises (a pool thread's exception would be
        swallowed by its future)."""
        task = outcome.task
        try:
            self.finished(outcome, seconds)  # first: the next step may ask its duration
        except BaseException:
            log.exception("could not record the end of activity %s of run %s", task.name, task.run_id)
        try:
            if answer and self._answered is not None and self._answered(outcome):
                self._buffer.attempt_ended(task)
                return
        except BaseException:
            log.exception("could not answer run %s with its activity's outcome; it is written as usual", task.run_id)
        try:
            self._buffer.add_activity_outcome(outcome)
        except BaseException:
            log.exception(
                "could not buffer the outcome of activity %s of run %s (attempt %d); it is retried when its lease"
                " expires",
                task.name,
                task.run_id,
                task.attempt,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )

    def is_transaction(self, name: str) -> bool:
        """Whether ``name`` is a transaction step here (``@dex.transaction``)."""
        definition = self._registry.find_activity(name)
        return definition is not None and definition.isolation is not None

    def _written(self, written: Written, seconds: float) -> None:
        task = written.task
        try:  # its duration is its function's, recorded by the attempt (transaction_steps.py)
            kind = "completed" if written.committed else "lost"
            self._telemetry.task_finished("activity", task.name, kind, seconds)
            if not written.committed:
                log.info(
                    "transaction step %s of run %s, attempt %d: its lease was taken over; nothing was written",
                    task.name,
                    task.run_id,
                    task.attempt,
                    extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
                )
            elif self._completed_directly is not None:
                self._completed_directly()
        except BaseException:
            log.exception("could not record the end of transaction step %s of run %s", task.name, task.run_id)

    def finished(self, outcome: ActivityOutcome, seconds: float) -> None:
        """Record an attempt that ended (here or inline): telemetry, its duration, a log line."""
        task = outcome.task
        if not self.is_transaction(task.name):  # a step's is its function's (transaction_steps.py)
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
        A transaction step's attempt writes its own outcome: what it returns then is an outcome
        the store discards (the task is gone, or its lease moved on); ``run`` uses ``attempt``."""
        outcome = self.attempt(task, heartbeat)
        if isinstance(outcome, Written):
            return ActivityOutcome(task=task, retry_at=self._store.clock.now())
        return outcome

    def attempt(self, task: ActivityTask, heartbeat: Callable[[], bool] | None = None) -> ActivityOutcome | Written:
        """``execute``, or for a transaction step, how the store decided it (:class:`Written`).

        Never raises: any ``BaseException`` of the activity's code (``SystemExit``,
        ``KeyboardInterrupt`` too) is a failed attempt naming its type, retried under the retry
        policy, and so is a failure of dex's own handling of the attempt."""
        try:
            return self._execute(task, heartbeat)
        except BaseException as exc:  # noqa: BLE001 - a failure of dex's own handling of the attempt
            return self._unhandled(task, exc)

    def _unhandled(self, task: ActivityTask, exc: BaseException) -> ActivityOutcome:
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

    def _execute(self, task: ActivityTask, heartbeat: Callable[[], bool] | None) -> ActivityOutcome | Written:
        ready = self._ready(task, heartbeat)
        if isinstance(ready, ActivityOutcome):
            return ready
        token = set_activity_context(ready)
        try:
            decoded = self._decode(task)
            if isinstance(decoded, ActivityOutcome):
                return decoded
            definition, args = decoded
            if definition.isolation is not None:  # a transaction step: the store runs it (never raises)
                with self._tracing.span(f"dex.transaction {task.name}", task.trace_context, span_attributes(task)):
                    return self._transactions.attempt(task, definition, args)
            try:
                with self._tracing.span(f"dex.activity {task.name}", task.trace_context, span_attributes(task)):
                    value = definition.fn(*args)
                    if definition.is_async or asyncio.iscoroutine(value):
                        value = self._async.run(value, lambda f: self.leases.on_cancel(task, f.cancel))
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... of user code are failures too
                return self._failed(task, exc)
            return self._outcome_of(task, value)
        finally:
            reset_activity_context(token)

    def _ready(
        self, task: ActivityTask, heartbeat: Callable[[], bool] | None, told: Callable[[], bool] = lambda: False
    ) -> ActivityOutcome | ActivityContext:
        """The attempt's context, or its final failure when its policy allows no attempt more;
        ``told``: the attempt was cancelled, whether its lease register still says so or not."""
        expired = lease_expired(task)
        if expired is not None:
            return expired
        return ActivityContext(
            run_id=task.run_id,
            activity_name=task.name,
            attempt=task.attempt,
            heartbeat_fn=heartbeat if heartbeat is not None else self._heartbeat_of(task),
            cancelled_fn=lambda: told() or self.leases.cancelled(task),  # an unleased (inline) attempt: never
            write_stream_fn=self._streams.writer(task.run_id),
        )

    def _outcome_of(self, task: ActivityTask, value: object) -> ActivityOutcome:
        try:
            return ActivityOutcome(task=task, result=self._converter.encode(value))
        except SerializationError as exc:
            return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))

    def _decode(self, task: ActivityTask) -> tuple[ActivityDefinition, list[Any]] | ActivityOutcome:
        """The task's definition and decoded arguments, or its final failure (bad input does not
        get better by retrying)."""
        try:
            definition = self._registry.activity(task.name)
            signature = definition.signature
            signature.check_arity(len(task.input), f"activity {task.name!r}")
            return definition, decode_arguments(self._converter, task.input, signature)
        except (NotRegisteredError, SerializationError, TypeError) as exc:
            return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))

    def transaction_work(self, task: ActivityTask) -> Callable[[Any], Payload] | ActivityOutcome:
        """A synchronous transaction step's work for a store to run in a transaction of its own
        choosing (:mod:`dex.app.workflows.step_groups`), under the attempt's activity context; or the
        attempt's final failure when its input cannot be decoded."""
        decoded = self._decode(task)
        if isinstance(decoded, ActivityOutcome):
            return decoded
        return self._transactions.work_of(*decoded, context=task)

    def failed(self, task: ActivityTask, exc: BaseException) -> ActivityOutcome:
        """The outcome of a transaction step's attempt that failed with ``exc``: a retry, or its
        final failure (at once when its result cannot be stored)."""
        try:
            return self._transactions.failed(task, exc)
        except BaseException:  # noqa: BLE001 - not even a retry could be computed: a final failure
            return ActivityOutcome(task=task, failure=described_failure(exc))

    def _heartbeat_of(self, task: ActivityTask) -> Callable[[], bool]:
        if self.is_transaction(task.name):
            # its task row stays locked until it commits: an extension would only wait for that
            return lambda: True
        return lambda: self._keeper.heartbeat(task)

    def keep_leases(self) -> int:
        """A step of the engine's activity thread (:class:`~dex.app.activities.lease_keeper.LeaseKeeper`):
        the running attempts' leases kept, overdue ones failed, cancelled runs' attempts told;
        and the attempts a dead event loop left behind failed. How many attempts it acted on."""
        return self._keeper.keep() + self._async.check()
