"""How ``Engine`` makes a run (SPEC §5, §12): ``start_workflow``'s checks done, the run's
``RunCreated`` built and written; and ``start_by_name``, a start by workflow name for an
engine that may not have the workflow's code (the dashboard's JSON API over a database).

A mixin of the engine facade, which keeps the one path every start takes: the arguments
encoded, the keys checked, the trace opened, the run created in this engine's way
(``Engine._create_run``) or in the caller's transaction (``connection``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from dex.app.ids import new_run_id
from dex.app.ports import RunFilter, Store
from dex.app.reads import RunReads
from dex.app.registry import Registry
from dex.app.runner import Foreground
from dex.app.tracing import Tracing
from dex.domain import events as ev
from dex.domain.definitions import (
    DEFAULT_QUEUE,
    PayloadConverter,
    validate_key,
    validate_name,
    validate_priority,
    validate_queue,
)
from dex.domain.steps import encode_arguments, normalize_labels


class StartEngineMixin:
    """``Engine``'s way of making runs."""

    store: Store
    registry: Registry
    converter: PayloadConverter
    tracing: Tracing
    foreground: Foreground
    code_version: str | None
    _rng: random.Random
    _reads: RunReads

    def _create_run(self, created: ev.RunCreated) -> str:
        raise NotImplementedError  # the engine's

    def start_workflow(self, fn_or_name: Any, *args: Any, **options: Any) -> str:
        raise NotImplementedError  # the engine's

    def start_by_name(
        self,
        name: str,
        args: Iterable[Any] = (),
        *,
        instance_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Start a run of the workflow named ``name``, its arguments a sequence. On an engine
        that registers workflows this is ``start_workflow`` (an unknown name:
        ``NotRegisteredError``); on one without any code (``dex web`` over a database) the run
        is made for the engines that have it, on ``queue``, else the queue of the newest run
        of that name, else ``"default"`` (the decorators' default), its arguments checked by
        the code that runs it."""
        args = tuple(args)
        if self.registry.workflows:
            return self.start_workflow(
                name,
                *args,
                instance_id=instance_id,
                queue=queue,
                priority=priority,
                concurrency_key=concurrency_key,
                labels=labels,
            )
        validate_name(name, "workflow name")
        if queue is None:
            newest = self.store.list_runs(RunFilter(workflow_name=name, limit=1))
            queue = newest[0].queue if newest else DEFAULT_QUEUE
        # the keys, priority and labels are checked before anything is written, as for any start,
        # and the store's create_run makes the queue if it is new
        return self._start(name, validate_queue(queue), args, instance_id, priority, concurrency_key, labels, None)

    def _start(
        self,
        name: str,
        queue: str,
        args: tuple[Any, ...],
        instance_id: str | None,
        priority: int,
        concurrency_key: str | None,
        labels: Mapping[str, str] | None,
        connection: Any,
    ) -> str:
        # a NUL would be cut off by libpq (two ids colliding) or fail a write: refused here
        instance_id = validate_key(instance_id, "instance_id")
        concurrency_key = validate_key(concurrency_key, "concurrency_key")
        payloads = encode_arguments(self.converter, args)
        with self.tracing.start_run(name, {"dex.workflow": name}) as trace_context:
            created = ev.RunCreated(
                workflow_name=name,
                input=payloads,
                queue=queue,
                instance_id=instance_id,
                priority=validate_priority(priority),
                concurrency_key=concurrency_key,
                labels=normalize_labels(labels),
                random_seed=self._rng.getrandbits(64),
                trace_context=trace_context,
                code_version=self.code_version,
            )
            with self.foreground.calling():
                if connection is not None:  # its scheduler finds it once the caller has committed
                    run_id = self.store.create_run_in(connection, new_run_id(), created, self.store.clock.now())
                else:
                    run_id = self._create_run(created)
        self._reads.started(run_id)
        return run_id
