"""The engine's read side: runs as ``RunInfo``, exported histories, and waiting for a run to end.

Nothing here writes. ``wait`` is woken by this engine's own flushes (``flushed``) and answers
from the outcomes those flushes wrote (``written``) when the run is one this engine ended, so
waiting for the runs an engine works on itself costs no round trip.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from dex.app.info import Outcomes, RunInfo
from dex.app.ports import RunFilter, RunRecord, Store
from dex.app.registry import Registry
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import RunNotFoundError, WorkflowCancelledError, WorkflowFailedError
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload, describe_failure
from dex.serialization.history import encode_history


class RunReads:
    """Reads runs from ``store``, decoding results with the registered workflows' return hints."""

    def __init__(self, store: Store, registry: Registry, converter: PayloadConverter) -> None:
        self._store, self._registry, self._converter = store, registry, converter
        self._outcomes = Outcomes()
        self._progress = threading.Condition()
        self._flushes = 0

    def written(self, run_id: str, workflow_name: str, outcome: ev.RunCompleted) -> None:
        """This engine wrote the end of a run: ``wait`` may answer from memory from now on."""
        self._outcomes.record(run_id, workflow_name, outcome)

    def flushed(self) -> None:
        """This engine wrote a batch: wake the waiters, a run of theirs may have ended."""
        with self._progress:
            self._flushes += 1
            self._progress.notify_all()

    def get_run(self, run_id: str) -> RunInfo:
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return self._info(record)

    def list_runs(self, run_filter: RunFilter) -> list[RunInfo]:
        return [self._info(record) for record in self._store.list_runs(run_filter)]

    def export_history(self, run_id: str) -> bytes:
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return encode_history(run_id, record.workflow_name, self._store.load_history(run_id))

    def wait(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Block until the run ends; return its result or raise its failure."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        while True:
            flushes = self._flushes
            written = self._outcomes.get(run_id)  # a run this engine ended: no need to read it back
            if written is not None:
                name, outcome = written
                result = self._decode_result(name, outcome.result)
                return _ended(run_id, outcome.status, result, outcome.failure)
            info = self.get_run(run_id)
            if info.status.is_terminal:
                return _ended(run_id, info.status, info.result, info.failure)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} did not finish within {timeout} s (status {info.status.value})")
            # woken at once by our own flushes; the timeout covers runs that other processes end
            with self._progress:
                if self._flushes == flushes:
                    self._progress.wait(
                        pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))
                    )
            pause = min(pause * 1.5, 0.05)

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
        )


def _ended(run_id: str, status: RunStatus, result: Any, failure: FailureInfo | None) -> Any:
    """What ``wait`` gives for a run that ended so: its result, or the error to raise."""
    if status is RunStatus.COMPLETED:
        return result
    if status is RunStatus.FAILED:
        assert failure is not None
        raise WorkflowFailedError(f"run {run_id} failed: {describe_failure(failure)}", failure)
    raise WorkflowCancelledError(f"run {run_id} was cancelled")
