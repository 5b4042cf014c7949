"""The engine's read side: runs as ``RunInfo``, histories, and waiting for a run to end.

:class:`RunReads` is the service behind ``Engine.get_run``, ``list_runs``, ``history``,
``activity_steps``, ``export_history`` and ``wait`` (the engine facade delegates each call to it). Nothing here writes. ``wait`` is woken by this engine's own flushes (``flushed``) and answers
from the outcomes those flushes wrote (``written``) when the run is one this engine ended, so
waiting for the runs an engine works on itself costs no round trip.

A process that starts runs and waits for them while others run them (a client, a web
application in front of a worker fleet) would read each run back with a round trip of its
own. So the runs this engine started and has not yet seen end are remembered
(``started``), and a ``wait`` that must read the store reads, in the same statement, the
oldest of them too: those that have ended go to the outcomes, where the next waits find them.
A run's outcome never changes once written, so nothing read ahead goes stale.

A wait outlives a store that fails for a while (docs/reference/contract.md §8: the machinery's faults are not the
caller's): a read that raises anything but a ``DexError`` (a connection lost, a pool timeout)
is retried with the wait's usual backoff until the wait's own deadline, and a wait that times
out while the store fails says so (``TimeoutError`` from the last store error). A
``DexError`` (an unknown run) is an answer, raised at once.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from dex.app.definitions.registry import Registry
from dex.app.facade.info import Outcomes, RunInfo
from dex.app.facade.steps import ActivityStep, activity_steps
from dex.app.ports.store import RunFilter, RunRecord, Store
from dex.domain import events as ev
from dex.domain.context import fire_time
from dex.domain.definitions import PayloadConverter, validate_key, validate_optional_text, validate_text
from dex.domain.errors import DexError, RunNotFoundError, WorkflowCancelledError, WorkflowFailedError
from dex.domain.status import RunStatus
from dex.domain.steps import normalize_labels
from dex.domain.values import FailureInfo, Payload, describe_failure
from dex.serialization.history import encode_history

log = logging.getLogger("dex.reads")


class RunReads:
    """Reads runs from ``store``, decoding results with the registered workflows' return hints.

    Each public method checks the run id it is given (:func:`run_id_of`) and raises what the
    engine's call of the same name raises."""

    def __init__(self, store: Store, registry: Registry, converter: PayloadConverter, *, read_ahead: int = 128) -> None:
        self._store, self._registry, self._converter = store, registry, converter
        self._outcomes = Outcomes()
        self._progress = threading.Condition()
        self._flushes = 0
        # runs this engine started whose end it has not seen, oldest first (at most as many
        # as the outcomes keep: an older one would be read ahead only to be forgotten)
        self._unseen: OrderedDict[str, None] = OrderedDict()
        self._unseen_lock = threading.Lock()
        self._read_ahead = read_ahead

    def started(self, run_id: str) -> None:
        """This engine started the run: a ``wait`` that reads the store may read its end too."""
        with self._unseen_lock:
            self._unseen[run_id] = None
            if len(self._unseen) > self._outcomes.capacity:
                self._unseen.popitem(last=False)

    def written(self, run_id: str, workflow_name: str, outcome: ev.RunCompleted) -> None:
        """This engine wrote the end of a run: ``wait`` may answer from memory from now on."""
        self._outcomes.record(run_id, workflow_name, outcome)
        self._seen(run_id)

    def _seen(self, *run_ids: str) -> None:
        with self._unseen_lock:
            for run_id in run_ids:
                self._unseen.pop(run_id, None)

    def flushed(self) -> None:
        """This engine wrote a batch: wake the waiters, a run of theirs may have ended."""
        with self._progress:
            self._flushes += 1
            self._progress.notify_all()

    @property
    def flushes(self) -> int:
        """How many batches this engine has written: a reader notes it before it reads."""
        return self._flushes

    def wait_for_flush(self, seen: int, seconds: float) -> None:
        """Wait up to ``seconds`` for a batch written after the reader saw ``seen`` of them (a
        reader of published values and streams, woken at once by this engine's own writes)."""
        with self._progress:
            if self._flushes == seen:
                self._progress.wait(max(0.0, seconds))

    def get_run(self, run_id: str) -> RunInfo:
        run_id = run_id_of(run_id)
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return self._info(record)

    def list_runs(self, run_filter: RunFilter) -> list[RunInfo]:
        """The runs ``run_filter`` (made by :func:`run_filter`, which checks its arguments) matches."""
        return [self._info(record) for record in self._store.list_runs(run_filter)]

    def history(self, run_id: str) -> list[ev.HistoryEvent]:
        return self._store.load_history(run_id_of(run_id))

    def activity_steps(self, run_id: str) -> list[ActivityStep]:
        """The run's activity steps with their attempts (:mod:`dex.app.facade.steps`). The
        attempts are read before the history: a step that ends between the two reads shows
        ended (the history has its outcome), never as a step with no attempt. It reads the
        whole history and every step's attempts, deliberately: a call about one run that wants
        all of it, whose outcomes may lie anywhere (the dashboard and the JSON API read a page
        at a time instead: :func:`~dex.app.facade.steps.steps_in`)."""
        run_id = run_id_of(run_id)
        kept = self._store.step_attempts(run_id)
        history = self._store.load_history(run_id)
        if not history:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return activity_steps(history, kept)

    def export_history(self, run_id: str) -> bytes:
        run_id = run_id_of(run_id)
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return encode_history(run_id, record.workflow_name, self._store.load_history(run_id))

    def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Block until the run ends; return its result or raise its failure.

        A store error (anything but a ``DexError``) is retried until the deadline; a
        ``TimeoutError`` raised while the store fails says so and chains its last error.
        """
        run_id = run_id_of(run_id)
        timeout = wait_seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        first = True
        failures = ReadFailures(run_id)
        status: RunStatus | None = None
        read_at = time.monotonic()  # when the store is read next
        while True:
            flushes = self._flushes
            written = self._outcomes.get(run_id)  # a run this engine ended: no need to read it back
            if written is not None:
                name, outcome = written
                result = self._decode_result(name, outcome.result)
                return outcome_of(run_id, outcome.status, result, outcome.failure)
            if time.monotonic() >= read_at:
                # A flush of ours that ended the run put it in the outcomes above, so a wake by
                # a flush reads nothing; the store is read on the backoff's clock alone, for the
                # runs that other processes (or this one, on paths that bypass the outcomes) end.
                try:
                    record = self._read_for_wait(run_id, ahead=first)  # polls read only the run itself
                except DexError:
                    raise  # an answer (no such run), not a failure of the store
                except Exception as exc:  # noqa: BLE001 - the store failed (a connection, a timeout): read again
                    failures.failed(exc)
                else:
                    failures.succeeded()
                    first = False
                    status = record.status
                    if record.status.is_terminal:
                        self._seen(run_id)
                        info = self._info(record)
                        return outcome_of(run_id, info.status, info.result, info.failure)
                read_at = time.monotonic() + pause
                pause = min(pause * 1.5, 0.05)
            if deadline is not None and time.monotonic() >= deadline:
                raise failures.timed_out(timeout, status)
            # woken at once by our own flushes; the timeout covers runs that other processes end
            with self._progress:
                if self._flushes == flushes:
                    until = read_at if deadline is None else min(read_at, deadline)
                    self._progress.wait(max(0.0, until - time.monotonic()))

    def _read_for_wait(self, run_id: str, ahead: bool) -> RunRecord:
        """The run, read from the store; with ``ahead`` (a wait's first read), the oldest runs
        this engine started and has not seen end are read in the same statement, and those
        that have ended are kept for the waits to come."""
        with self._unseen_lock:
            others = list(islice((o for o in self._unseen if o != run_id), self._read_ahead)) if ahead else []
        if not others:
            found = self._store.get_run(run_id)
            if found is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            return found
        records = {record.run_id: record for record in self._store.get_runs([run_id, *others])}
        ended = []
        for other in others:
            record = records.get(other)
            if record is not None and record.status.is_terminal:
                outcome = ev.RunCompleted(status=record.status, result=record.result, failure=record.failure)
                self._outcomes.record(other, record.workflow_name, outcome)
            if record is None or record.status.is_terminal:  # ended, or gone: nothing to read again
                ended.append(other)
        self._seen(*ended)
        found = records.get(run_id)
        if found is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return found

    def _decode_result(self, workflow_name: str, result: Payload | None) -> Any:
        if result is None:
            return None
        definition = self._registry.find_workflow(workflow_name)
        return self._converter.decode(result, definition.signature.returns if definition is not None else None)

    def _info(self, record: RunRecord) -> RunInfo:
        return RunInfo(
            run_id=record.run_id,
            workflow_name=record.workflow_name,
            instance_id=record.instance_id,
            status=record.status,
            custom_status=record.custom_status,
            priority=record.priority,
            concurrency_key=record.concurrency_key,
            labels=dict(record.labels),
            parent_run_id=record.parent_run_id,
            created_at=record.created_at,
            started_at=record.started_at,
            completed_at=record.completed_at,
            result=self._decode_result(record.workflow_name, record.result),
            failure=record.failure,
            code_version=record.code_version,
            task_failure=record.task_failure,
            scheduled_at=fire_time(record.labels, record.instance_id),
            forked_from=record.forked_from,
            deadline=record.deadline,
            unread_events=record.unread_events,
        )


class ReadFailures:
    """The store errors one wait met while reading its run: each is logged (the first of a
    spell at INFO, the others at DEBUG), and a wait that times out while they last says so."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.count = 0  # failed reads in a row
        self.last: Exception | None = None

    def failed(self, exc: Exception) -> None:
        self.count += 1
        self.last = exc
        log.log(
            logging.INFO if self.count == 1 else logging.DEBUG,
            "wait for run %s: reading it from the store failed (%s, %d in a row); retrying until the wait's timeout",
            self.run_id,
            _describe(exc),
            self.count,
            extra={"run_id": self.run_id},
        )

    def succeeded(self) -> None:
        self.count = 0
        self.last = None

    def timed_out(self, timeout: float | None, status: RunStatus | None) -> TimeoutError:
        """The ``TimeoutError`` a wait raises at its deadline (chaining the store's last error
        if its last read failed)."""
        if self.last is None:
            shown = status.value if status is not None else "unknown"
            return TimeoutError(f"run {self.run_id} did not finish within {timeout} s (status {shown})")
        error = TimeoutError(
            f"run {self.run_id} was not seen to finish within {timeout} s: the store was failing "
            f"({self.count} read(s) in a row failed, the last with {_describe(self.last)})"
        )
        error.__cause__ = self.last
        return error


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an error that cannot say what it is still has a type
        text = "<unprintable>"
    text = text.strip().splitlines()[0] if text.strip() else ""
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def wait_seconds(timeout: object) -> float | None:
    """A wait's ``timeout`` in seconds: None (no limit), or a number or timedelta of at least 0.

    A negative, NaN or non-numeric timeout is a mistake to report, not a wait of no time.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise ValueError(f"timeout must be None, a number of seconds or a timedelta, got {type(timeout).__name__}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must be None or at least 0 seconds, got {timeout!r}")
    return seconds


def run_id_of(run_id: object) -> str:
    """A run id as the calls take it: a str (``start_workflow`` returns one), storable as text."""
    if isinstance(run_id, uuid.UUID):
        raise TypeError(f"run_id must be a str, got the UUID {run_id}: pass str(run_id)")
    return validate_text(run_id, "run_id")


def run_filter(
    workflow_name: str | None,
    statuses: Iterable[RunStatus | str] | None,
    labels: Mapping[str, str] | None,
    instance_id: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    limit: int,
    code_version: str | None = None,
) -> RunFilter:
    """The filter of ``Engine.list_runs``, its arguments checked."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    return RunFilter(
        workflow_name=validate_optional_text(workflow_name, "workflow_name"),
        statuses=frozenset(RunStatus(s) for s in statuses) if statuses is not None else None,
        labels=normalize_labels(labels),
        instance_id=validate_optional_text(instance_id, "instance_id"),
        created_after=aware_datetime(created_after, "created_after"),
        created_before=aware_datetime(created_before, "created_before"),
        limit=limit,
        code_version=validate_key(code_version, "code_version"),
    )


def aware_datetime(value: object, field: str) -> datetime | None:
    """A ``list_runs`` bound: None, or a timezone-aware datetime (a naive one has no one meaning)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{field} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{field} must be timezone-aware (e.g. datetime.now(timezone.utc)), got the naive {value.isoformat()}"
        )
    return value


def outcome_of(run_id: str, status: RunStatus, result: Any, failure: FailureInfo | None) -> Any:
    """What ``wait`` gives for a run that ended so: its result, or the error to raise."""
    if status is RunStatus.COMPLETED:
        return result
    if status is RunStatus.FAILED:
        assert failure is not None
        raise WorkflowFailedError(f"run {run_id} failed: {describe_failure(failure)}", failure)
    if status is RunStatus.TERMINATED:  # the failure holds the reason (docs/reference/contract.md §14)
        reason = failure.message if failure is not None else "terminated"
        raise WorkflowCancelledError(f"run {run_id} was terminated: {reason}")
    raise WorkflowCancelledError(f"run {run_id} was cancelled")
