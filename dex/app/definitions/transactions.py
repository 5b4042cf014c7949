"""``@dex.transaction``: an activity whose function runs inside the store's own transaction.

The decorated function takes the transaction's connection first (``psycopg.Connection``, or
``psycopg.AsyncConnection`` for an ``async def``), then the step's arguments. It registers and
is called like any activity (``Engine(activities=[...])``, ``ctx.activity(fn, ...)``) and
appears in the history as one; what differs is how its attempt runs
(:mod:`dex.app.activities.transaction_steps`). The connection it gets is the store's own (a real
``psycopg.Connection`` on PostgreSQL); the store refuses what would end the transaction that
makes the step's outcome durable (committing, rolling back or closing it: a terminal error
naming the step).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE
from dex.domain.definitions import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_QUEUE,
    ISOLATION_LEVELS,
    ActivityDefinition,
    Signature,
    validate_name,
    validate_queue,
)
from dex.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy

F = TypeVar("F", bound=Callable[..., Any])


@overload
def transaction(fn: F, /) -> F: ...
@overload
def transaction(
    *, name: str | None = None, queue: str = DEFAULT_QUEUE, retry: RetryPolicy | None = None, isolation: str = ...
) -> Callable[[F], F]: ...
def transaction(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    isolation: str = "read committed",
) -> Any:
    """Mark ``fn(conn, *args)`` (sync or ``async def``) as a transaction step."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a dex.RetryPolicy, got {type(retry).__name__}")
    if not isinstance(isolation, str) or isolation.lower() not in ISOLATION_LEVELS:
        levels = ", ".join(repr(level) for level in ISOLATION_LEVELS)
        raise ValueError(f"isolation must be one of {levels}, got {isolation!r}")
    level = isolation.lower()

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@dex.transaction decorates a function, got {type(func).__name__}")
        signature = Signature.of(func)
        if not signature.parameters and not signature.accepts_varargs:
            raise TypeError(f"transaction step {func.__qualname__} must take the connection as its first parameter")
        definition = ActivityDefinition(
            name=validate_name(name if name is not None else func.__qualname__, "activity name"),
            fn=func,
            queue=validate_queue(queue),
            retry_policy=retry or DEFAULT_RETRY_POLICY,
            lock_timeout=DEFAULT_LOCK_TIMEOUT,
            signature=Signature.of(func, skip=1),
            is_async=inspect.iscoroutinefunction(func),
            isolation=level,
        )
        setattr(func, ACTIVITY_ATTRIBUTE, definition)
        return func

    return decorate(fn) if fn is not None else decorate
