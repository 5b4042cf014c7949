"""WorkflowContext: the only door from workflow code to the outside world (docs/reference/contract.md §3).

Every member is deterministic: time is the time of the current workflow task, randomness is
seeded per run, and each step is a command that replay matches against the history.
"""

from __future__ import annotations

import functools
import logging
import random as _random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, Protocol, TypeVar

from dex.domain import events as ev
from dex.domain.coroutines import DexFuture
from dex.domain.definitions import validate_optional_text
from dex.domain.handlers import UpdateHandler
from dex.domain.retry import RetryPolicy
from dex.domain.values import Payload

T = TypeVar("T")


class StepIssuer(Protocol):
    """What the context needs of the executor driving the code (``dex.domain.replay``): the
    run's identity and task time, and a step for each request. The executor sits above the
    context (it makes one), so the context names only this."""

    run_id: str
    workflow_name: str
    created: ev.RunCreated
    generation: int
    now: datetime
    is_replaying: bool
    custom_status: str | None
    labels: dict[str, str]

    def schedule_activity(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        queue: str | None,
        retry: RetryPolicy | None,
        priority: int | None,
    ) -> DexFuture[Any]: ...

    def start_timer(self, delay: timedelta | float) -> DexFuture[None]: ...

    def wait_for_event(self, event_id: str, timeout: timedelta | float | None) -> DexFuture[Any]: ...

    def start_child(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        instance_id: str | None,
        queue: str | None,
        concurrency_key: str | None,
        priority: int | None,
        labels: Mapping[str, str] | None,
        timeout: timedelta | float | None = None,
        id_reuse: object = "allow",
    ) -> DexFuture[Any]: ...

    def gather(self, awaitables: Sequence[Awaitable[Any]]) -> DexFuture[list[Any]]: ...

    def first(
        self, awaitables: Sequence[Awaitable[Any]], timeout: timedelta | float | None
    ) -> DexFuture[tuple[int, Any]]: ...

    def wait_condition(self, predicate: Callable[[], object], timeout: timedelta | float | None) -> DexFuture[None]: ...

    def on_update(self, name: str, fn: Callable[..., Any]) -> UpdateHandler: ...

    def on_query(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def on_event(self, event_id: str, fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def publish(self, key: str, value: Any) -> None: ...

    def write_stream(self, key: str, value: Any) -> DexFuture[None]: ...

    def close_stream(self, key: str) -> None: ...

    def set_labels(self, changes: Mapping[str, str | None]) -> None: ...

    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        instance_id: str | None,
        queue: str | None,
        concurrency_key: str | None,
        priority: int | None,
        labels: Mapping[str, str] | None,
        timeout: timedelta | float | None,
        id_reuse: object = "allow",
    ) -> str: ...

    def check_writable(self, what: str) -> None: ...

    def side_effect(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any: ...

    def encode_arguments(self, args: tuple[Any, ...]) -> tuple[Payload, ...]: ...

    def patched(self, patch_id: str) -> bool: ...

    def deprecate_patch(self, patch_id: str) -> None: ...


class ContinueAsNew(BaseException):
    """Raised by :meth:`WorkflowContext.continue_as_new` to end the current generation.

    A BaseException so that ``except Exception`` in workflow code does not swallow it.
    """

    def __init__(self, payloads: tuple[Payload, ...]) -> None:
        super().__init__("continue_as_new")
        self.payloads = payloads  # the next generation's input, encoded at the call


class _ReplayFilter(logging.Filter):
    def __init__(self, executor: StepIssuer) -> None:
        super().__init__()
        self._executor = executor

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._executor.is_replaying


class WorkflowContext:
    """Passed as the first argument to every workflow function."""

    def __init__(self, executor: StepIssuer) -> None:
        self._executor = executor

    # made on first use: most workflows never ask, and seeding costs ~10 us each (a run's every
    # executor, also one that replays it elsewhere, seeds them alike, so nothing depends on when)
    @functools.cached_property
    def _seeded(self) -> _random.Random:
        return _random.Random(f"dex-random:{self._executor.created.random_seed}:{self._executor.generation}")

    @functools.cached_property
    def _uuid_seeded(self) -> _random.Random:
        return _random.Random(f"dex-uuid:{self._executor.created.random_seed}:{self._executor.generation}")

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """The workflow's logger (``dex.workflow.<name>``); silent while the code replays."""
        logger = logging.Logger(f"dex.workflow.{self._executor.workflow_name}")
        logger.parent = logging.getLogger("dex.workflow")
        logger.addFilter(_ReplayFilter(self._executor))
        return logger

    # -- metadata -------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self._executor.run_id

    @property
    def workflow_name(self) -> str:
        return self._executor.workflow_name

    @property
    def instance_id(self) -> str | None:
        return self._executor.created.instance_id

    @property
    def labels(self) -> Mapping[str, str]:
        """The run's labels now: those it started with, changed by ``set_labels``."""
        return dict(self._executor.labels)

    @property
    def scheduled_at(self) -> datetime | None:
        """The fire time of the schedule that started this run (UTC, before jitter); None for
        runs no schedule started (docs/reference/contract.md §10)."""
        return scheduled_at(self._executor.created)

    @property
    def is_replaying(self) -> bool:
        """True while the code re-runs steps that the history already recorded."""
        return self._executor.is_replaying

    # -- deterministic sources ------------------------------------------------------------
    def now(self) -> datetime:
        """The time of the current workflow task (UTC, aware), the same on every replay."""
        return self._executor.now

    def random(self) -> _random.Random:
        """A random generator seeded per run: it yields the same values on replay."""
        return self._seeded

    def uuid4(self) -> uuid.UUID:
        """A version-4 UUID from the run's seeded generator."""
        return uuid.UUID(int=self._uuid_seeded.getrandbits(128), version=4)

    # -- steps ----------------------------------------------------------------------------
    def activity(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        queue: str | None = None,
        retry: RetryPolicy | None = None,
        priority: int | None = None,
    ) -> DexFuture[Any]:
        """Schedule an activity now; await the returned future for its result."""
        return self._executor.schedule_activity(fn_or_name, args, queue=queue, retry=retry, priority=priority)

    def sleep(self, delay: timedelta | float) -> DexFuture[None]:
        """A durable timer: await it to wait ``delay`` (seconds or a timedelta)."""
        return self._executor.start_timer(delay)

    def wait_for_event(self, event_id: str, timeout: timedelta | float | None = None) -> DexFuture[Any]:
        """Await the payload of the next external event ``event_id`` (FIFO per id)."""
        return self._executor.wait_for_event(event_id, timeout)

    def child(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: timedelta | float | None = None,
        id_reuse: str = "allow",
    ) -> DexFuture[Any]:
        """Start a child workflow now; await the returned future for its result. ``timeout``
        sets its deadline: when it passes the child is cancelled with reason "timeout".
        ``id_reuse`` (with an ``instance_id``): under ``"failed_only"`` or ``"never"``, an ended
        run of that id that answers the start is the child's outcome, and no run is made
        (docs/reference/contract.md §15)."""
        return self._executor.start_child(
            fn_or_name,
            args,
            instance_id=instance_id,
            queue=queue,
            concurrency_key=concurrency_key,
            priority=priority,
            labels=labels,
            timeout=timeout,
            id_reuse=id_reuse,
        )

    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        *args: Any,
        instance_id: str | None = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: timedelta | float | None = None,
        id_reuse: str = "allow",
    ) -> str:
        """Start an independent run (not a child: it outlives this one), recorded once; returns
        its run id (docs/reference/contract.md §14). ``id_reuse`` as for ``start_workflow`` (§15): the store
        makes no run when an earlier run of the ``instance_id`` answers."""
        return self._executor.start_workflow(
            fn_or_name,
            args,
            instance_id=instance_id,
            queue=queue,
            concurrency_key=concurrency_key,
            priority=priority,
            labels=labels,
            timeout=timeout,
            id_reuse=id_reuse,
        )

    def gather(self, *awaitables: Awaitable[Any]) -> DexFuture[list[Any]]:
        """Await several steps (or coroutines) at once; results come in argument order."""
        return self._executor.gather(awaitables)

    def first(self, *steps: Awaitable[Any], timeout: timedelta | float | None = None) -> DexFuture[tuple[int, Any]]:
        """Await whichever step finishes first: ``(index, result)`` (its exception if it failed;
        ``WaitTimeoutError`` after ``timeout``). The others stay pending, to be awaited later or
        cancelled; a losing ``wait_for_event`` consumes no event."""
        return self._executor.first(steps, timeout)

    def wait_condition(
        self, predicate: Callable[[], object], timeout: timedelta | float | None = None
    ) -> DexFuture[None]:
        """Return once ``predicate()`` is true, re-checked after every handler, event and step
        result; ``WaitTimeoutError`` after ``timeout``. The predicate only reads state."""
        return self._executor.wait_condition(predicate, timeout)

    # -- talking to the outside (docs/reference/contract.md §14) ---------------------------------
    def on_update(self, name: str) -> Callable[[Callable[..., Any]], UpdateHandler]:
        """Decorator: ``engine.update(run_id, name, *args)`` runs the function (sync or async)
        inside the workflow and returns its result; ``.validator`` on the result refuses
        requests before anything is recorded."""

        def register(fn: Callable[..., Any]) -> UpdateHandler:
            return self._executor.on_update(name, fn)

        return register

    def on_query(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: ``engine.query(run_id, name, *args)`` returns the (sync) function's result,
        computed from the run's current state; it records nothing and may change nothing."""

        def register(fn: Callable[..., T]) -> Callable[..., T]:
            self._executor.on_query(name, fn)
            return fn

        return register

    def on_event(self, event_id: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: every external event ``event_id`` (those buffered first) is handed to the
        (sync) function in arrival order, instead of waiting for ``wait_for_event``."""

        def register(fn: Callable[..., T]) -> Callable[..., T]:
            self._executor.on_event(event_id, fn)
            return fn

        return register

    def publish(self, key: str, value: Any) -> None:
        """Record ``value`` as the latest under ``key``; ``engine.get_published`` reads it."""
        self._executor.publish(key, value)

    def write_stream(self, key: str, value: Any) -> DexFuture[None]:
        """Append ``value`` to the stream ``key`` (await it); the outside reads it in order while
        the run goes on. ``ValueError`` once the stream is closed."""
        return self._executor.write_stream(key, value)

    def close_stream(self, key: str) -> None:
        """End the stream ``key``: its readers stop after its last item."""
        self._executor.close_stream(key)

    def set_labels(self, changes: Mapping[str, str | None]) -> None:
        """Change the run's labels: a value sets one, None removes it."""
        self._executor.set_labels(changes)

    def side_effect(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` once and record its result; replay returns the recorded value."""
        return self._executor.side_effect(name, fn, args)  # type: ignore[no-any-return]

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new branch of a code change (docs/reference/contract.md §11).

        A run that reaches this call for the first time returns True and records
        ``PatchApplied(patch_id)``; a run whose history was made by code without the patch
        replays the old branch (False). The answer is fixed for the rest of the run. A
        ``patch_id`` that is not a valid name (NUL, lone surrogates, ...) raises ValueError.
        """
        return self._executor.patched(patch_id)

    def deprecate_patch(self, patch_id: str) -> None:
        """Replaces ``patched(patch_id)`` once no live run can take the old branch: records
        nothing, and accepts histories with or without the patch's event."""
        self._executor.deprecate_patch(patch_id)

    def set_status(self, text: str | None) -> None:
        """Set the custom status shown in ``RunInfo.custom_status``."""
        self._executor.check_writable("set the run's status")
        if text is not None and not isinstance(text, str):
            raise TypeError(f"set_status takes a str or None, got {type(text).__name__}")
        # refused here, at the call, where the code can catch it: stored, it would fail the write
        self._executor.custom_status = validate_optional_text(text, "status")

    def continue_as_new(self, *args: Any) -> NoReturn:
        """End this generation and start the same run afresh with ``args``; an argument that
        cannot be serialised raises ``SerializationError`` here, at the call (docs/reference/contract.md §2)."""
        self._executor.check_writable("continue as new")
        raise ContinueAsNew(self._executor.encode_arguments(args))


def scheduled_at(created: ev.RunCreated) -> datetime | None:
    """A scheduled run's fire time, read from its ``RunCreated``: the ``dex.schedule`` label
    names the schedule and the instance id, ``schedule:<name>:[trigger:]<YYYY-MM-DDTHH:MM:SSZ>``,
    ends with the time (so the history alone gives it on every replay)."""
    return fire_time(created.labels, created.instance_id)


def fire_time(labels: ev.Labels, instance: str | None) -> datetime | None:
    """:func:`scheduled_at` from a run's labels and instance id (``RunInfo.scheduled_at``)."""
    name = dict(labels).get("dex.schedule")
    if name is None or instance is None or not instance.startswith(f"schedule:{name}:"):
        return None
    try:
        return datetime.strptime(instance[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
