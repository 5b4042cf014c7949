"""How ``Engine`` makes a run (docs/reference/contract.md §5, §12): :class:`Starts`, the service behind
``start_workflow`` and ``start_by_name`` (a start by workflow name for an engine that may not
have the workflow's code: the dashboard's JSON API over a database).

Every start takes one path: the arguments checked and encoded, the keys checked, the trace
opened, the run created in the engine's way (the ``create_run`` it is given, which on a
started engine may claim the run's first task at once) or in the caller's transaction
(``connection``), and the run remembered for ``wait`` (``started``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from dex.app.definitions.registry import Registry
from dex.app.machinery.threads import Foreground
from dex.app.ports.ids import new_run_id
from dex.app.ports.store import RunFilter, Store
from dex.app.ports.tracing import Tracing
from dex.domain import events as ev
from dex.domain.definitions import (
    DEFAULT_QUEUE,
    PayloadConverter,
    validate_key,
    validate_name,
    validate_priority,
    validate_queue,
)
from dex.domain.errors import NotRegisteredError
from dex.domain.instance_keys import StartRule, start_rule
from dex.domain.steps import delay_of, encode_arguments, normalize_labels


class Starts:
    """Makes runs over ``store`` for the workflows of ``registry``.

    ``create_run`` writes a run's ``RunCreated`` outside any caller's transaction and returns
    its id; ``started`` is told each run made (its id), so that a wait may read its end ahead.
    ``code_version`` is recorded in every run; ``rng`` draws each run's random seed.
    ``create_keyed_run`` makes a run under a :class:`~dex.domain.instance_keys.StartRule` that
    is not plain (``id_reuse``, ``debounce``: docs/reference/contract.md §15); without it, the
    store's ``start_keyed_run`` does, and no scheduler is woken.
    """

    def __init__(
        self,
        store: Store,
        registry: Registry,
        converter: PayloadConverter,
        *,
        tracing: Tracing,
        foreground: Foreground,
        rng: random.Random,
        code_version: str | None,
        create_run: Callable[[ev.RunCreated], str],
        started: Callable[[str], None],
        create_keyed_run: Callable[[ev.RunCreated, StartRule], str] | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._converter = converter
        self._tracing = tracing
        self._foreground = foreground
        self._rng = rng
        self._code_version = code_version
        self._create_run = create_run
        self._started = started
        self._create_keyed_run = create_keyed_run

    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        instance_id: str | None,
        queue: str | None,
        priority: int,
        concurrency_key: str | None,
        labels: Mapping[str, str] | None,
        connection: Any,
        timeout: timedelta | float | None = None,
        id_reuse: object = "allow",
        debounce: object = None,
        debounce_max: object = None,
    ) -> str:
        """``Engine.start_workflow``, its arguments passed by position (the start path is hot)."""
        definition = self._registry.workflow(fn_or_name)  # a name no workflow can have: says why
        definition.signature.check_arity(len(args), f"workflow {definition.name!r}")
        queue = validate_queue(queue) if queue is not None else definition.queue
        return self._start(
            definition.name,
            queue,
            args,
            instance_id,
            priority,
            concurrency_key,
            labels,
            connection,
            timeout,
            (id_reuse, debounce, debounce_max),
        )

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
        force: bool = False,
        id_reuse: object = "allow",
        debounce: object = None,
        debounce_max: object = None,
    ) -> str:
        """``Engine.start_by_name``: with registered workflows, ``start_workflow``; without
        any code, the run is made on ``queue``, else the queue of the newest run of that name,
        else ``"default"`` — if a live engine registers the workflow (the engine registry,
        docs/reference/contract.md §15), or with ``force``; else ``NotRegisteredError`` naming
        it, and nothing is written (a run nobody runs would wait, CREATED, for ever)."""
        args = tuple(args)
        if self._registry.workflows:
            return self.start_workflow(
                name,
                args,
                instance_id,
                queue,
                priority,
                concurrency_key,
                labels,
                None,
                id_reuse=id_reuse,
                debounce=debounce,
                debounce_max=debounce_max,
            )
        validate_name(name, "workflow name")
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, got {type(force).__name__}")
        if not force and not any(name in e.workflows for e in self._store.list_engines(self._store.clock.now())):
            raise NotRegisteredError(
                f"no live engine registers the workflow {name!r}: start an engine that does "
                "(`dex engines` lists them), or force the start to make the run for one that starts later"
            )
        if queue is None:
            newest = self._store.list_runs(RunFilter(workflow_name=name, limit=1))
            queue = newest[0].queue if newest else DEFAULT_QUEUE
        # the keys, priority and labels are checked before anything is written, as for any start,
        # and the store's create_run makes the queue if it is new
        return self._start(
            name,
            validate_queue(queue),
            args,
            instance_id,
            priority,
            concurrency_key,
            labels,
            None,
            reuse=(id_reuse, debounce, debounce_max),
        )

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
        timeout: timedelta | float | None = None,
        reuse: tuple[object, object, object] = ("allow", None, None),
    ) -> str:
        # a NUL would be cut off by libpq (two ids colliding) or fail a write: refused here
        instance_id = validate_key(instance_id, "instance_id")
        concurrency_key = validate_key(concurrency_key, "concurrency_key")
        rule = start_rule(instance_id, *reuse)
        payloads = encode_arguments(self._converter, args)
        deadline = None if timeout is None else deadline_of(self._store.clock.now(), timeout)
        with self._tracing.start_run(name, {"dex.workflow": name}) as trace_context:
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
                code_version=self._code_version,
                deadline=deadline,
            )
            with self._foreground.calling():
                if not rule.plain:
                    run_id = self._keyed(created, rule, connection)
                elif connection is not None:  # its scheduler finds it once the caller has committed
                    run_id = self._store.create_run_in(connection, new_run_id(), created, self._store.clock.now())
                else:
                    run_id = self._create_run(created)
        self._started(run_id)
        return run_id

    def _keyed(self, created: ev.RunCreated, rule: StartRule, connection: Any) -> str:
        """A start under a rule that looks at the instance id's earlier runs (the store decides)."""
        if connection is not None or self._create_keyed_run is None:
            return self._store.start_keyed_run(new_run_id(), created, self._store.clock.now(), rule, connection)
        return self._create_keyed_run(created, rule)


def deadline_of(now: datetime, timeout: timedelta | float) -> datetime:
    """When a run started ``now`` with ``timeout`` (a timedelta or seconds, not negative) is
    cancelled with reason "timeout" (docs/reference/contract.md §14)."""
    try:
        return now + delay_of(timeout)
    except OverflowError:
        raise ValueError(f"timeout {timeout!r} puts the deadline past the last date a run can have") from None
