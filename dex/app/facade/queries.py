"""``engine.query`` (docs/reference/contract.md §14): ask a run, read-only, never recorded.

:class:`RunQueries` answers from the executor this engine's workflow worker keeps for the run,
when it keeps one that stands where the stored history ends (borrowed from the cache for the
call, so no task of the run uses it meanwhile, and given back after); otherwise it replays the
history here, in the caller's thread (:func:`dex.domain.task.answer_query`), and closes that
executor. Either way nothing is written, and an ended run answers too.

The handler is workflow code: whatever it raises, including a ``BaseException`` or an
exception that cannot be printed, is the caller's ``QueryError``, and the run is not touched.
On an engine with code that is not started, the call first runs what is due (as
``drain(advance_time=False)``), so a run just started has registered its handlers; on any
other engine, a run that no worker has started yet is answered from its code run as its first
task would until it blocks, recording nothing (``WorkflowExecutor.preview``). A query
runs the workflow's code, so an engine without it (``dex web`` over a database, the command
line without ``--app``) cannot answer one: QueryError says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dex.app.definitions.registry import Registry
from dex.app.facade.reads import run_id_of
from dex.app.ports.store import Store
from dex.app.workflows.executors import ExecutorCache
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import QueryError, RunNotFoundError
from dex.domain.handlers import validate_handler_name
from dex.domain.task import answer_query


class RunQueries:
    """Answers queries about the runs of ``store`` with this engine's registered code."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        converter: PayloadConverter,
        *,
        cache: ExecutorCache,
        drives: Callable[[], bool],
        drive: Callable[[], None],
    ) -> None:
        self._store = store
        self._registry = registry
        self._converter = converter
        self._cache = cache
        self._drives = drives
        self._drive = drive

    def query(self, run_id: str, name: str, args: Sequence[Any]) -> Any:
        """``Engine.query``: the handler's result; QueryError, RunNotFoundError."""
        run_id = run_id_of(run_id)
        name = validate_handler_name(name, "query name")
        payloads = tuple(self._converter.encode(arg) for arg in args)
        if self._drives():
            self._drive()
        lent = self._cache.take(run_id)
        if lent is not None:
            try:
                _first, last = self._store.history_bounds(run_id)
                if last == lent.last_seq:  # it stands where the stored history ends: its state is the run's
                    return self._decode(lent.executor.query(name, payloads))
            finally:
                self._cache.give_back(run_id, lent)
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        definition = self._registry.find_workflow(record.workflow_name)
        if definition is None:
            raise QueryError(
                f"run {run_id} is of workflow {record.workflow_name!r}, which this engine does not register:"
                " a query runs the workflow's code"
            )
        history = self._store.load_history(run_id)
        answer = answer_query(
            definition,
            run_id,
            history,
            name,
            payloads,
            self._converter,
            activities=self._registry.find_activity,
            workflows=self._registry.find_workflow,
        )
        return self._decode(answer)

    def _decode(self, payload: Any) -> Any:
        return None if payload is None else self._converter.decode(payload)
