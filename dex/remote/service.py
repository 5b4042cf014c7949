"""The remote workers' service (docs/reference/contract.md §13): poll, complete, fail and heartbeat activity tasks.

One implementation, which the HTTP routes (:mod:`dex.remote.http_routes`) and the gRPC server
(:mod:`dex.remote.grpc_server`) both call. A remote worker claims tasks by name through the
store's ordinary claim (priorities, pause, capacity, ``SKIP LOCKED``) under a lease of its own,
``min(lease, lock_timeout)``; each later call names the task by id and ``lease_version``, and is
refused with :class:`~dex.remote.errors.LeaseLostError` (409) when that lease is no longer held:
expired, taken over, used up, or the run ended. The store's write checks the lease again under
its lock, so a race is refused the same way and nothing changes.

The lease a worker gets is bound to it: each poll's claim is made under a fresh random token,
its ``lease_version`` (a JSON integer below 2**53, which JavaScript reads exactly). The task's
row holds the lease's owner as the worker's id and a digest of that token, so only the worker
that polled can complete, fail or heartbeat the task: a guessed or stale ``lease_version`` is
refused (409), and so is a ``worker_id``, when the call names one, that is not the claimer's.

A long poll claims at once; when nothing is there, it waits until this process makes activity
tasks due (the engine's coordinator tells the service through
:meth:`dex.app.facade.engine.Engine.on_activity_work`) or one poll interval passes, and claims again —
no LISTEN/NOTIFY: tasks made due by other processes are found within a poll interval. A poll
that waits holds a place of the service's :class:`~dex.app.runtime.long_polls.LongPolls` gate
(``long_poll_limit``, 100 by default); past the limit it is refused at once with
:class:`~dex.remote.errors.PollLimitError` (503, ``Retry-After``), so idle workers never hold
what the other calls need. Over HTTP the wait is a coroutine on the event loop
(:meth:`ActivityTaskService.poll_async`), which holds no thread at all; over gRPC a server
thread, of which the server keeps one per place of the gate beside those of the other calls.

Arguments and results cross as JSON (:mod:`dex.serialization.json_form`). A task whose
arguments have no JSON form is failed for good at the poll, with that error, and is not handed
out; the poll returns the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs

from dex.app.activities.attempts import Retries, lease_expired
from dex.app.facade.engine import Engine
from dex.app.ports.store import DEFAULT_ACTIVITY_LEASE, ActivityOutcome, ActivityTask, Store, StoreRejectedError
from dex.app.ports.telemetry import TelemetryHub
from dex.app.runtime.long_polls import LongPolls
from dex.domain import events as ev
from dex.domain.errors import SerializationError
from dex.domain.values import FailureInfo
from dex.remote import values
from dex.remote.errors import InvalidValueError, LeaseLostError, PollLimitError, RemoteCallError, UnavailableError
from dex.remote.values import MAX_TASKS, MAX_WAIT_SECONDS, PolledTask, RemoteFailure
from dex.serialization.json_form import NoJsonFormError, json_values, payload_of_json
from dex.serialization.payloads import DEFAULT_MAX_PAYLOAD_SIZE

log = logging.getLogger("dex.remote")

_REMEMBERED = 100_000  # task ids handed out whose runs a heartbeat may look up after the row is gone
DEFAULT_LONG_POLL_LIMIT = 100  # long polls open at once, per service
# A lease token: random, at least 1 and below 2**53, so a JSON number in any language holds it exactly.
_TOKEN_BOUND = 2**53 - 1
_DIGEST = 16  # hexadecimal characters of a token's digest at the end of the lease's owner


@attrs.frozen(kw_only=True)
class _Poll:
    """A poll's request, checked."""

    owner: str
    names: frozenset[str]
    limit: int
    wait: float


@attrs.frozen(kw_only=True)
class _Handed:
    """A task a poll handed out: its run (a heartbeat after the row is gone asks it) and its lease's owner."""

    run_id: str
    owner: str
    created_seq: int = 0  # the step's, in its run's history


class ActivityTaskService:
    """Activity tasks for workers in other languages, over a store or an engine's store.

    Given an :class:`~dex.app.facade.engine.Engine`, a long poll wakes as soon as that engine makes
    activity tasks due; given a store, it claims once per ``poll_interval`` seconds while it
    waits. ``lease`` is the remote attempt's lease (at most each task's ``lock_timeout``), which
    every heartbeat renews; a worker that stops calling loses its task when it lapses, and the
    task is claimed again as its next attempt. At most ``long_poll_limit`` polls wait at once
    (over HTTP and gRPC together); given an engine, ``engine.health()`` reports them.
    """

    def __init__(
        self,
        target: Store | Engine,
        *,
        poll_interval: float = 1.0,
        lease: timedelta = DEFAULT_ACTIVITY_LEASE,
        rng: random.Random | None = None,
        max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
        long_poll_limit: int = DEFAULT_LONG_POLL_LIMIT,
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
        # the polls waiting on event loops (HTTP): each is woken through its loop, thread-safely
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._handed: OrderedDict[int, _Handed] = OrderedDict()  # task id -> its claim, the latest handed out
        if isinstance(target, Engine):
            self.long_polls = target.long_poll_gate(long_poll_limit)
            target.on_activity_work(self.wake)
        else:
            self.long_polls = LongPolls(long_poll_limit)

    def wake(self) -> None:
        """Activity tasks may be due: waiting polls claim again now."""
        with self._work:
            self._signals += 1
            self._work.notify_all()
            waiters = list(self._async_waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing waits there any more
                loop.call_soon_threadsafe(event.set)

    # -- the calls -------------------------------------------------------------------------------
    def poll(
        self, worker_id: object, names: object, max_tasks: object = 1, wait_seconds: object = 0
    ) -> list[PolledTask]:
        """Claim up to ``max_tasks`` tasks named in ``names`` for ``worker_id``; when there are
        none, wait up to ``wait_seconds`` for some (an empty list when none came). The wait
        blocks this thread (gRPC); :meth:`poll_async` waits on an event loop instead (HTTP). A
        poll that would wait while ``long_poll_limit`` polls do is refused at once
        (:class:`PollLimitError`)."""
        poll = _poll(worker_id, names, max_tasks, wait_seconds)
        deadline = time.monotonic() + poll.wait
        with self._long_poll(poll):
            while True:
                seen = self._seen()
                tasks = self._claim(poll)
                left = deadline - time.monotonic()
                if tasks or left <= 0:
                    return tasks
                with self._work:
                    if self._signals == seen:
                        self._work.wait(min(self.poll_interval, left))

    async def poll_async(
        self, worker_id: object, names: object, max_tasks: object = 1, wait_seconds: object = 0
    ) -> list[PolledTask]:
        """:meth:`poll` for an event loop: its claims run in the loop's default executor (each a
        short store call), and its wait is a coroutine, which holds no thread while it waits."""
        poll = _poll(worker_id, names, max_tasks, wait_seconds)
        deadline = time.monotonic() + poll.wait
        loop = asyncio.get_running_loop()
        with self._long_poll(poll):
            while True:
                seen = self._seen()
                tasks = await loop.run_in_executor(None, self._claim, poll)
                left = deadline - time.monotonic()
                if tasks or left <= 0:
                    return tasks
                await self._wait_async(loop, seen, min(self.poll_interval, left))

    def complete(self, task_id: object, lease_version: object, result: Any, worker_id: object = None) -> None:
        """Record the attempt's result: a JSON value."""
        tid, token, worker = _call(task_id, lease_version, worker_id)
        try:
            payload = payload_of_json(result, max_size=self.max_payload_size)
        except SerializationError as exc:
            raise InvalidValueError(f"the result of activity task {tid} cannot be recorded: {exc}") from None
        task = self._held(tid, token, worker)
        self._write(ActivityOutcome(task=task, result=payload), tid)

    def fail(self, task_id: object, lease_version: object, error: RemoteFailure, worker_id: object = None) -> None:
        """Record a failed attempt: retried under the task's retry policy unless terminal or out
        of attempts (then the run's ``ctx.activity`` raises it). Its texts are kept bounded
        (``dex.domain.values.failure_text``), as every failure's are."""
        tid, token, worker = _call(task_id, lease_version, worker_id)
        error = values.failure(error)
        task = self._held(tid, token, worker)
        info = FailureInfo(type=error.type, message=error.message, terminal=error.terminal)
        after = None if error.retry_after_seconds is None else timedelta(seconds=error.retry_after_seconds)
        self._write(self._retries.retry_or_fail(task, info, after), tid)

    def heartbeat(self, task_id: object, lease_version: object, worker_id: object = None) -> bool:
        """Renew the lease; True when the attempt should stop (``cancel_requested``): its run
        was cancelled or ended. A lease lost otherwise is a :class:`LeaseLostError`."""
        tid, token, worker = _call(task_id, lease_version, worker_id)
        try:
            found, now = self._find(tid), self.store.clock.now()
            if found is not None and _holds(found.lease.owner, token, worker) and found.lease.until > now:
                if self.store.extend_activity_leases([found], now, self.lease) == [True]:
                    return False
            if self._run_ended(tid, token, worker):
                return True
        except RemoteCallError:
            raise
        except StoreRejectedError as exc:
            raise InvalidValueError(f"the store refused the heartbeat: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        raise _lost(tid)

    # -- inside ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _long_poll(self, poll: _Poll) -> Iterator[None]:
        """A place of the gate while a poll that may wait runs; a poll that does not wait
        (``wait_seconds`` 0) needs none: it is a short call like the others."""
        if poll.wait <= 0:
            yield
            return
        if not self.long_polls.enter():
            raise PollLimitError(
                f"{self.long_polls.limit} long polls are open, the most this server keeps; poll again in a second"
            )
        try:
            yield
        finally:
            self.long_polls.leave()

    def _seen(self) -> int:
        with self._work:
            return self._signals

    async def _wait_async(self, loop: asyncio.AbstractEventLoop, seen: int, timeout: float) -> None:
        """Wait on ``loop`` until :meth:`wake` (after wake-up ``seen``) or ``timeout`` seconds."""
        waiter = (loop, asyncio.Event())
        with self._work:
            if self._signals != seen:
                return
            self._async_waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter[1].wait(), timeout)
        finally:
            with self._work:
                self._async_waiters.discard(waiter)

    def _claim(self, poll: _Poll) -> list[PolledTask]:
        """Claim under a fresh lease token: the token is the tasks' ``lease_version``, and the
        lease's owner, as the store keeps it, the worker's id with the token's digest."""
        store, token = self.store, secrets.randbelow(_TOKEN_BOUND) + 1
        owner = _owner(poll.owner, token)
        try:
            claimed = store.claim_activity_tasks(poll.names, owner, store.clock.now(), self.lease, poll.limit)
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        polled: list[PolledTask] = []
        refused: list[ActivityOutcome] = []
        for task in claimed:
            outcome = self._refusal(task)
            if outcome is not None:
                refused.append(outcome)
                continue
            polled.append(self._polled(task, token))
            self._remember(task)
        if refused:
            try:
                store.complete_activity_tasks(refused, store.clock.now())
            except Exception:
                log.warning("could not record the failures of %d activity task(s)", len(refused), exc_info=True)
        return polled

    def _refusal(self, task: ActivityTask) -> ActivityOutcome | None:
        """The final failure of a claimed task that cannot be handed out: out of attempts after a
        lost lease (as :class:`~dex.app.activities.worker.ActivityWorker` does), or arguments with
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

    def _polled(self, task: ActivityTask, token: int) -> PolledTask:
        return PolledTask(
            task_id=task.task_id,
            run_id=task.run_id,
            name=task.name,
            attempt=task.attempt,
            args=tuple(json_values(task.input)),
            lease_version=token,
            lease_until=task.lease.until,
            heartbeat_timeout=min(self.lease, task.lock_timeout).total_seconds(),
        )

    def _remember(self, task: ActivityTask) -> None:
        with self._lock:
            self._handed[task.task_id] = _Handed(
                run_id=task.run_id, owner=task.lease.owner, created_seq=task.created_seq
            )
            self._handed.move_to_end(task.task_id)
            while len(self._handed) > _REMEMBERED:
                self._handed.popitem(last=False)

    def _find(self, tid: int) -> ActivityTask | None:
        try:
            (found,) = self.store.find_activity_tasks([tid])
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        return found

    def _held(self, tid: int, token: int, worker: str | None) -> ActivityTask:
        """The task as stored, if the lease the call names still holds it."""
        task = self._find(tid)
        if task is None or not _holds(task.lease.owner, token, worker) or task.lease.until <= self.store.clock.now():
            raise _lost(tid)
        return task

    def _run_ended(self, tid: int, token: int, worker: str | None) -> bool:
        """The run of a task this service handed out under this lease has ended, or its code
        cancelled the step (docs/reference/contract.md §14: the task was dropped); only its
        claimer may learn it."""
        with self._lock:
            handed = self._handed.get(tid)
        if handed is None or not _holds(handed.owner, token, worker):
            return False
        run = self.store.get_run(handed.run_id)
        if run is None or run.status.is_terminal:
            return True
        if self._find(tid) is not None:
            return False  # the task is there: its lease was lost otherwise
        return any(
            isinstance(item.event, ev.CancelRequested) and item.event.created_seq == handed.created_seq
            for item in self.store.load_history(handed.run_id)
        )

    def _write(self, outcome: ActivityOutcome, tid: int) -> None:
        try:
            (applied,) = self.store.complete_activity_tasks([outcome], self.store.clock.now())
        except StoreRejectedError as exc:
            raise InvalidValueError(f"the store refused the outcome of activity task {tid}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the store failed: a 503, the call may be made again
            raise _unavailable(exc) from None
        if not applied:
            raise _lost(tid)
        with self._lock:
            self._handed.pop(tid, None)


def _poll(worker_id: object, names: object, max_tasks: object, wait_seconds: object) -> _Poll:
    return _Poll(
        owner=values.text(worker_id, "worker_id"),
        names=values.names(names),
        limit=values.count(max_tasks, "max", MAX_TASKS),
        wait=values.seconds(wait_seconds, "wait_seconds", MAX_WAIT_SECONDS),
    )


def _call(task_id: object, lease_version: object, worker_id: object) -> tuple[int, int, str | None]:
    """A task call's task id, lease token and (when sent) worker id, checked."""
    worker = None if worker_id is None else values.text(worker_id, "worker_id")
    return values.task_id(task_id), values.lease_version(lease_version), worker


def _digest(token: int) -> str:
    """What the store keeps of a lease token: its digest, so the owner it reads does not give
    the token away (to a log, a dump of the table)."""
    return hashlib.blake2b(str(token).encode("ascii"), digest_size=_DIGEST // 2).hexdigest()


def _owner(worker: str, token: int) -> str:
    """A remote claim's lease owner: the worker's id, then the token's digest (fixed length)."""
    return f"{worker}#{_digest(token)}"


def _holds(owner: str, token: int, worker: str | None) -> bool:
    """Whether the lease owned by ``owner`` is the one claimed under ``token`` (by ``worker``,
    when the call names one). The owner of a Python engine's lease ends in no such digest."""
    if worker is not None:
        return hmac.compare_digest(_bytes(owner), _bytes(_owner(worker, token)))
    suffix = f"#{_digest(token)}"
    return len(owner) > len(suffix) and hmac.compare_digest(_bytes(owner[-len(suffix) :]), _bytes(suffix))


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # an owner the store read may hold anything


def _lost(tid: int) -> LeaseLostError:
    return LeaseLostError(
        f"activity task {tid} is not held under this lease: the lease expired or was taken over, the"
        " attempt was completed or failed already, the run ended, or another worker claimed it"
    )


def _unavailable(exc: Exception) -> UnavailableError:
    try:
        detail = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    except Exception:  # noqa: BLE001 - an error that cannot be printed
        detail = "an error that could not be described"
    log.warning("a remote worker's call failed in the store: %s", detail)
    return UnavailableError(f"the store failed ({detail[:500]}); try again")
