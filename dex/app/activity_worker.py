"""The activity worker: claims activity tasks, runs their attempts, hands each outcome (a
result, a final failure or a retry) to the result buffer.

Like every worker it is a plain object whose ``poll_once()`` does one round; the engine's
threads call it in a loop and ``Engine.drain()`` calls it inline, which is what makes a whole
engine steppable from one thread. The engine's pool runs single attempts with ``run()``, and
inline attempts (:mod:`dex.app.inline`) call ``execute()``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from datetime import timedelta
from typing import Any

from dex.app.activity_context import ActivityContext, reset_activity_context, set_activity_context
from dex.app.async_activities import AsyncRunner
from dex.app.attempts import Durations, described_failure, undescribed_failure
from dex.app.buffer import ResultBuffer
from dex.app.held import TASK_RETRY
from dex.app.leases import ActivityLeases
from dex.app.ports import DEFAULT_ACTIVITY_LEASE, ActivityOutcome, ActivityTask, Store
from dex.app.registry import Registry
from dex.app.telemetry import Telemetry, TelemetryHub
from dex.app.tracing import NoTracing, Tracing
from dex.app.transaction_steps import TransactionAttempts, Written
from dex.domain.definitions import ActivityDefinition, PayloadConverter
from dex.domain.errors import NotRegisteredError, SerializationError
from dex.domain.values import ApplicationError, FailureInfo, Payload

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
    ) -> None:
        self._store, self._registry, self._converter, self._buffer = store, registry, converter, buffer
        self.leases = ActivityLeases(lease)  # the attempts this worker runs under a lease
        self._telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._tracing: Tracing = tracing if tracing is not None else NoTracing()
        self._node_id, self._rng, self._async, self._batch_size = node_id, rng, async_runner, batch_size
        self._names = frozenset(registry.activities)
        self._rng_lock = threading.Lock()
        self.durations = Durations()
        self._transactions = TransactionAttempts(
            store, converter, async_runner.run, self._failed, self.durations.record, self.given_back
        )
        # called after a transaction step wrote its completion itself: a workflow task became due
        self.completed_directly: Callable[[], None] | None = None
        # set by a started engine: takes an outcome as the step it answers (dex.app.answers);
        # False: the outcome is buffered as usual
        self.answered: Callable[[ActivityOutcome], bool] | None = None

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
        try:
            self.finished(outcome, time.perf_counter() - started)  # first: the next step may ask its duration
        except BaseException:
            log.exception("could not record the end of activity %s of run %s", task.name, task.run_id)
        try:
            if self.answered is not None and self.answered(outcome):
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
            elif self.completed_directly is not None:
                self.completed_directly()
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
        except BaseException as exc:
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
            heartbeat_fn=heartbeat if heartbeat is not None else self._heartbeat_of(task),
            cancelled_fn=lambda: self.leases.cancelled(task),  # an unleased (inline) attempt: never
        )
        token = set_activity_context(context)
        try:
            decoded = self._decode(task)
            if isinstance(decoded, ActivityOutcome):
                return decoded
            definition, args = decoded
            attributes: dict[str, str | int] = {
                "dex.run_id": task.run_id,
                "dex.activity": task.name,
                "dex.attempt": task.attempt,
            }
            if definition.isolation is not None:  # a transaction step: the store runs it (never raises)
                with self._tracing.span(f"dex.transaction {task.name}", task.trace_context, attributes):
                    return self._transactions.attempt(task, definition, args)
            try:
                with self._tracing.span(f"dex.activity {task.name}", task.trace_context, attributes):
                    value = definition.fn(*args)
                    if definition.is_async or asyncio.iscoroutine(value):
                        value = self._async.run(value, lambda f: self.leases.on_cancel(task, f.cancel))
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... of user code are failures too
                return self._failed(task, exc)
            try:
                return ActivityOutcome(task=task, result=self._converter.encode(value))
            except SerializationError as exc:
                return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))
        finally:
            reset_activity_context(token)

    def _decode(self, task: ActivityTask) -> tuple[ActivityDefinition, list[Any]] | ActivityOutcome:
        """The task's definition and decoded arguments, or its final failure (bad input does not
        get better by retrying)."""
        try:
            definition = self._registry.activity(task.name)
            signature = definition.signature
            signature.check_arity(len(task.input), f"activity {task.name!r}")
            return definition, [self._converter.decode(p, signature.hint_for(i)) for i, p in enumerate(task.input)]
        except (NotRegisteredError, SerializationError, TypeError) as exc:
            return ActivityOutcome(task=task, failure=FailureInfo.from_exception(exc, terminal=True))

    def transaction_work(self, task: ActivityTask) -> Callable[[Any], Payload] | ActivityOutcome:
        """A synchronous transaction step's work for a store to run in a transaction of its own
        choosing (:mod:`dex.app.step_groups`), under the attempt's activity context; or the
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
        return lambda: self._heartbeat(task)

    def _heartbeat(self, task: ActivityTask) -> bool:
        """The attempt's ``heartbeat()``: moves its deadline (``lock_timeout`` from now) and
        extends its lease at once; False once the lease is lost or given up, or the run was
        cancelled or ended (``cancel_requested``)."""
        if self.leases.cancelled(task) or not self.leases.heartbeat(task, self._store.clock.now()):
            return False
        if self._buffer.heartbeat(task):
            return True
        self._cancel(task)  # the lease is lost: the attempt is told so
        return False

    def _cancel(self, task: ActivityTask) -> None:
        # what it returns from now on is discarded by the store's lease check: its lease is lost,
        # or its task went with its run
        self.leases.cancel(task)

    def keep_leases(self) -> int:
        """A step of the engine's activity thread: queue the extensions of the running attempts'
        leases when due, fail the attempts past their ``lock_timeout`` (leases.py), and, about
        once a second, tell the attempts whose runs were cancelled or ended (SPEC §13)."""
        now = self._store.clock.now()
        decided = self.leases.step(now)
        for task in decided.extend:
            if not self._buffer.heartbeat(task):
                self._cancel(task)
        self._tell_cancelled(self.leases.due_checks(now))
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

    def _tell_cancelled(self, tasks: tuple[ActivityTask, ...]) -> None:
        """Cancel the attempts whose runs were cancelled or ended (or are gone)."""
        if not tasks:
            return
        try:
            runs = self._store.get_runs(sorted({t.run_id for t in tasks}))
        except Exception:
            log.info("could not read the runs of the running activities", exc_info=True)
            return
        live = {run.run_id for run in runs if not run.status.is_terminal}
        for task in tasks:
            if task.run_id not in live:
                self._cancel(task)

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

    def given_back(self, task: ActivityTask) -> ActivityOutcome:
        """A retry of ``task`` as the same attempt (the store failed its transaction step, not
        its code), after ``TASK_RETRY``'s backoff for the claims that did not count."""
        uncounted = max(1, task.lease.version - task.attempt + 1)  # claims of this task less its attempts
        with self._rng_lock:
            delay = TASK_RETRY.next_delay(uncounted, self._rng) or TASK_RETRY.max_delay
        return ActivityOutcome(task=task, retry_at=self._store.clock.now() + delay, counts=False)

    def _failed(self, task: ActivityTask, exc: BaseException) -> ActivityOutcome:
        try:
            failure = FailureInfo.from_exception(exc)
            retry_after = exc.retry_after if isinstance(exc, ApplicationError) else None
        except BaseException:  # noqa: BLE001 - describing it raised (a hostile __str__): a failure all the same
            failure, retry_after = undescribed_failure(exc), None
        return self._retry_or_fail(task, failure, retry_after)

    def _retry_or_fail(
        self, task: ActivityTask, failure: FailureInfo, retry_after: timedelta | None
    ) -> ActivityOutcome:
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
