"""The ``@dex.workflow`` and ``@dex.activity`` decorators and the per-engine registry."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar, overload

from dex.domain.definitions import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_QUEUE,
    ActivityDefinition,
    Signature,
    WorkflowDefinition,
    validate_name,
    validate_queue,
)
from dex.domain.errors import NotRegisteredError
from dex.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy

F = TypeVar("F", bound=Callable[..., Any])

WORKFLOW_ATTRIBUTE = "__dex_workflow__"
ACTIVITY_ATTRIBUTE = "__dex_activity__"


@overload
def workflow(fn: F, /) -> F: ...
@overload
def workflow(*, name: str | None = None, queue: str = DEFAULT_QUEUE, version: object = ...) -> Callable[[F], F]: ...
def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    version: object = ...,
) -> Any:
    """Mark an ``async def fn(ctx, *args)`` as a workflow (bare or with options).

    ``version`` is retired (docs/reference/contract.md §11): it never changed what ran, so it now only
    warns. Name the deployed code with ``Engine(code_version=...)`` (recorded per run,
    filterable) and branch in the code with ``ctx.patched(...)``.
    """
    if version is not ...:
        warnings.warn(
            "@dex.workflow(version=) is retired and changes nothing: name the deployed code with "
            "Engine(code_version=...) and branch with ctx.patched(...) (docs/how-to/deploy-new-code.md)",
            DeprecationWarning,
            stacklevel=2,
        )

    def decorate(func: F) -> F:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"workflow {func.__qualname__} must be an async def function")
        definition = WorkflowDefinition(
            name=validate_name(name if name is not None else func.__qualname__, "workflow name"),
            fn=func,
            queue=validate_queue(queue),
            signature=Signature.of(func, skip=1),
        )
        setattr(func, WORKFLOW_ATTRIBUTE, definition)
        return func

    return decorate(fn) if fn is not None else decorate


@overload
def activity(fn: F, /) -> F: ...
@overload
def activity(
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    lock_timeout: timedelta | float = DEFAULT_LOCK_TIMEOUT,
) -> Callable[[F], F]: ...
def activity(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    lock_timeout: timedelta | float = DEFAULT_LOCK_TIMEOUT,
) -> Any:
    """Mark a function (sync or ``async def``) as an activity (bare or with options)."""
    if isinstance(lock_timeout, (int, float)):
        lock_timeout = timedelta(seconds=lock_timeout)
    if lock_timeout <= timedelta(0):
        raise ValueError(f"lock_timeout must be positive, got {lock_timeout}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a dex.RetryPolicy, got {type(retry).__name__}")

    def decorate(func: F) -> F:
        definition = ActivityDefinition(
            name=validate_name(name if name is not None else func.__qualname__, "activity name"),
            fn=func,
            queue=validate_queue(queue),
            retry_policy=retry or DEFAULT_RETRY_POLICY,
            lock_timeout=lock_timeout,
            signature=Signature.of(func),
            is_async=inspect.iscoroutinefunction(func),
        )
        setattr(func, ACTIVITY_ATTRIBUTE, definition)
        return func

    return decorate(fn) if fn is not None else decorate


def _definition(fn: Any, attribute: str, what: str) -> Any:
    definition = getattr(fn, attribute, None)
    if definition is None:
        raise TypeError(f"{fn!r} is not a dex {what}: decorate it with @dex.{what}")
    return definition


class MalformedNameError(NotRegisteredError, ValueError):
    """A name no workflow can have was asked for: it is not registered (``NotRegisteredError``,
    docs/reference/contract.md §5) and is refused as a bad value (``ValueError``, naming the pattern it breaks)."""


class Registry:
    """The workflows and activities one engine knows, by name."""

    def __init__(self, workflows: Iterable[Callable[..., Any]] = (), activities: Iterable[Callable[..., Any]] = ()):
        self.workflows: dict[str, WorkflowDefinition] = {}
        self.activities: dict[str, ActivityDefinition] = {}
        for fn in workflows:
            definition = _definition(fn, WORKFLOW_ATTRIBUTE, "workflow")
            self._add(self.workflows, definition, "workflow")
        for fn in activities:
            definition = _definition(fn, ACTIVITY_ATTRIBUTE, "activity")
            self._add(self.activities, definition, "activity")

    @staticmethod
    def _add(table: dict[str, Any], definition: Any, what: str) -> None:
        existing = table.get(definition.name)
        if existing is not None and existing.fn is not definition.fn:
            raise ValueError(f"two different {what}s are registered as {definition.name!r}")
        table[definition.name] = definition

    def workflow(self, fn_or_name: Callable[..., Any] | str) -> WorkflowDefinition:
        """The registered workflow definition for a decorated function or a name."""
        name = (
            fn_or_name if isinstance(fn_or_name, str) else _definition(fn_or_name, WORKFLOW_ATTRIBUTE, "workflow").name
        )
        try:
            return self.workflows[name]
        except KeyError:
            try:
                validate_name(name, "workflow name")
            except ValueError as invalid:  # no workflow can have it: unknown (docs/reference/contract.md §5), and why
                raise MalformedNameError(f"{invalid}; no workflow of this engine has it") from None
            raise NotRegisteredError(f"workflow {name!r} is not registered with this engine") from None

    def activity(self, name: str) -> ActivityDefinition:
        try:
            return self.activities[name]
        except KeyError:
            raise NotRegisteredError(f"activity {name!r} is not registered with this engine") from None

    def find_workflow(self, name: str) -> WorkflowDefinition | None:
        return self.workflows.get(name)

    def find_activity(self, name: str) -> ActivityDefinition | None:
        return self.activities.get(name)
