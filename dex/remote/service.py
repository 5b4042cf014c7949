"""The remote workers' service (SPEC §13): poll, complete, fail and heartbeat activity tasks.

One implementation, which the HTTP routes (:mod:`dex.remote.http_routes`) and the gRPC server
(:mod:`dex.remote.grpc_server`) both call. A remote worker claims tasks by name through the
store's ordinary claim (priorities, pause, capacity, ``SKIP LOCKED``) under a lease of its own,
``min(lease, lock_timeout)``; each later call names the task by id and ``lease_version``, and is
refused with :class:`~dex.remote.errors.LeaseLostError` (409) when that lease is no longer held:
expired, taken over, used up, or the run ended. The store's write checks the lease again under
its lock, so a race is refused the same way and nothing changes.

A long poll claims at once; when nothing is there, it waits until this process makes activity
tasks due (the engine's coordinator tells the service through
:meth:`dex.app.engine.Engine.on_activity_work`) or one poll interval passes, and claims again —
no LISTEN/NOTIFY: tasks made due by other processes are found within a poll interval.

Arguments and results cross as JSON (:mod:`dex.serialization.json_form`). A task whose
arguments have no JSON form is failed for good at the poll, with that error, and is not handed
out; the poll returns the others.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Any

from dex.app.attempts import Retries, lease_expired
from dex.app.engine import Engine
from dex.app.ports import DEFAULT_ACTIVITY_LEASE, ActivityOutcome, ActivityTask, Store, StoreRejectedError
from dex.app.telemetry import TelemetryHub
from dex.domain.errors import SerializationError
from dex.domain.values import FailureInfo
from dex.remote import values
from dex.remote.errors import InvalidValueError, LeaseLostError, RemoteCallError, UnavailableError
from dex.remote.values import MAX_TASKS, MAX_WAIT_SECONDS, PolledTask, RemoteFailure
from dex.serialization.json_form import NoJsonFormError, json_values, payload_of_json
from dex.serialization.payloads import DEFAULT_MAX_PAYLOAD_SIZE

log = logging.getLogger("dex.remote")

_REMEMBERED = 100_000  # task ids handed out whose runs a heartbeat may look up after the row is gone


class ActivityTaskService:
    """Activity tasks for workers in other languages, over a store or an engine's store.

    Given an :class:`~dex.app.engine.Engine`, a long poll wakes as soon as that engine makes
    activity tasks due; given a store, it claims once per ``poll_interval`` seconds while it
    waits. ``lease`` is the remote attempt's lease (at most each task's ``lock_timeout``), which
    every heartbeat renews; a worker that stops calling loses its task when it lapses, and the
    task is claimed again as its next attempt.
    """

    def __init__(
        self,
        target: Store | Engine,
        *,
        poll_interval: float = 1.0,
        lease: timedelta = DEFAULT_ACTIVITY_LEASE,
        rng: random.Random | None = None,
        max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease!r}")
        self.store: Store = target.store if isinstance(target, Engine) else target
        self.poll_interval, self.lease, self.max_payload_size = poll_interval, lease, max_payload_size
        # the jitter of retries' delays (its telemetry is unused: a remote attempt never times out here)
        self._retries = Retries(lambda: self.store.clock.now(), rng or random.Random(), TelemetryHub())
        self._lock = threading.Lock()
        self._work = threading.Condition(threading.Lock())
        self._signals = 0  # counts the wake-ups, so a poll misses none between its claim and its wait
        self._handed: OrderedDict[int, str] = OrderedDict()  # task id -> run id, the latest handed out
        if isinstance(target, Engine):
            target.on_activity_work(self.wake)

    def wake(self) -> None:
        """Activity tasks may be due: waiting polls claim again now."""
        with self._work:
            self._signals += 1
            self._work.notify_all()

    # -- the calls -------------------------------------------------------------------------------
    def poll(
        self, worker_id: object, names: object, max_tasks: object = 1, wait_seconds: object = 0
    ) -> list[PolledTask]:
        """Claim up to ``max_tasks`` tasks named in ``names`` for ``worker_id``; when there are
        none, wait up to ``wait_seconds`` for some (an empty list when none came)."""
        owner = values.text(worker_id, "worker_id")
        wanted = values.names(names)
        limit = values.count(max_tasks, "max", MAX_TASKS)
        wait = values.seconds(wait_seconds, "wait_seconds", MAX_WAIT_SECONDS)
        deadline = time.monotonic() + wait
        while True:
            with self._work:
                seen = self._signals
            tasks = self._claim(owner, wanted, limit)
            left = deadline - time.monotonic()
            if tasks or left <= 0:
                return tasks
            with self._work:
                if self._signals == seen:
                    self._work.wait(min(self.poll_interval, left))

    def complete(self, task_id: object, lease_version: object, result: Any) -> None:
        """Record the attempt's result: a JSON value."""
        tid, version = values.task_id(task_id), values.lease_version(lease_version)
        try:
            payload = payload_of_json(result, max_size=self.max_payload_size)
        except SerializationError as exc:
            raise InvalidValueError(f"the result of activity task {tid} cannot be recorded: {exc}") from None
        task = self._held(tid, version)
        self._write(ActivityOutcome(task=task, result=payload), tid, version)

    def fail(self, task_id: object, lease_version: object, error: RemoteFailure) -> None:
        """Record a failed attempt: retried under the task's retry policy unless terminal or out
        of attempts (then the run's ``ctx.activity`` raises it)."""
        tid, version = values.task_id(task_id), values.lease_version(lease_version)
        error = values.failure(error)
        task = self._held(tid, version)
        info = FailureInfo(type=error.type, message=error.message, terminal=error.terminal)
        after = None if error.retry_after_seconds is None else timedelta(seconds=error.retry_after_seconds)
        self._write(self._retries.retry_or_fail(task, info, after), tid, version)

    def heartbeat(self, task_id: object, lease_version: object) -> bool:
        """Renew the lease; True when the attempt should stop (``cancel_requested``): its run
        was cancelled or ended. A lease lost otherwise is a :class:`LeaseLostError`."""
        tid, version = values.task_id(task_id), values.lease_version(lease_version)
        try:
            found, now = self._find(tid), self.store.clock.now()
            if found is not None and found.lease.version == version and found.lease.until > now:
                if self.store.extend_activity_leases([found], now, self.lease) == [True]:
                    return False
            if self._run_ended(tid):
                return True
        except RemoteCallError:
            raise
        except StoreRejectedError as exc:
            raise InvalidValueError(f"the store refused the heartbeat: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        raise _lost(tid, version)

    # -- inside ------------------------------------------------------------------------------------
    def _claim(self, owner: str, names: frozenset[str], limit: int) -> list[PolledTask]:
        store = self.store
        try:
            claimed = store.claim_activity_tasks(names, owner, store.clock.now(), self.lease, limit)
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        polled: list[PolledTask] = []
        refused: list[ActivityOutcome] = []
        for task in claimed:
            outcome = self._refusal(task)
            if outcome is not None:
                refused.append(outcome)
                continue
            polled.append(self._polled(task))
            self._remember(task)
        if refused:
            try:
                store.complete_activity_tasks(refused, store.clock.now())
            except Exception:
                log.warning("could not record the failures of %d activity task(s)", len(refused), exc_info=True)
        return polled

    def _refusal(self, task: ActivityTask) -> ActivityOutcome | None:
        """The final failure of a claimed task that cannot be handed out: out of attempts after a
        lost lease (as :class:`~dex.app.activity_worker.ActivityWorker` does), or arguments with
        no JSON form. None for a task to hand out."""
        expired = lease_expired(task)
        if expired is not None:
            return expired
        try:
            json_values(task.input)
        except NoJsonFormError as exc:
            failure = FailureInfo(
                type=type(exc).__name__,
                message=f"the arguments of activity {task.name!r} cannot be sent to a remote worker: {exc}",
                terminal=True,
            )
            return ActivityOutcome(task=task, failure=failure)
        return None

    def _polled(self, task: ActivityTask) -> PolledTask:
        return PolledTask(
            task_id=task.task_id,
            run_id=task.run_id,
            name=task.name,
            attempt=task.attempt,
            args=tuple(json_values(task.input)),
            lease_version=task.lease.version,
            lease_until=task.lease.until,
            heartbeat_timeout=min(self.lease, task.lock_timeout).total_seconds(),
        )

    def _remember(self, task: ActivityTask) -> None:
        with self._lock:
            self._handed[task.task_id] = task.run_id
            self._handed.move_to_end(task.task_id)
            while len(self._handed) > _REMEMBERED:
                self._handed.popitem(last=False)

    def _find(self, tid: int) -> ActivityTask | None:
        try:
            (found,) = self.store.find_activity_tasks([tid])
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        return found

    def _held(self, tid: int, version: int) -> ActivityTask:
        """The task as stored, if the lease the call names still holds it."""
        task = self._find(tid)
        if task is None or task.lease.version != version or task.lease.until <= self.store.clock.now():
            raise _lost(tid, version)
        return task

    def _run_ended(self, tid: int) -> bool:
        with self._lock:
            run_id = self._handed.get(tid)
        if run_id is None:
            return False
        run = self.store.get_run(run_id)
        return run is None or run.status.is_terminal

    def _write(self, outcome: ActivityOutcome, tid: int, version: int) -> None:
        try:
            (applied,) = self.store.complete_activity_tasks([outcome], self.store.clock.now())
        except StoreRejectedError as exc:
            raise InvalidValueError(f"the store refused the outcome of activity task {tid}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        if not applied:
            raise _lost(tid, version)
        with self._lock:
            self._handed.pop(tid, None)


def _lost(tid: int, version: int) -> LeaseLostError:
    return LeaseLostError(
        f"activity task {tid} is not held under lease version {version}: the lease expired or was taken"
        " over, the attempt was completed or failed already, or the run ended"
    )


def _unavailable(exc: Exception) -> UnavailableError:
    try:
        detail = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    except Exception:  # noqa: BLE001 - an error that cannot be printed
        detail = "an error that could not be described"
    log.warning("a remote worker's call failed in the store: %s", detail)
    return UnavailableError(f"the store failed ({detail[:500]}); try again")
