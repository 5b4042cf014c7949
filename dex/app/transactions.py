"""``@dex.transaction``: an activity whose function runs inside the store's own transaction.

The decorated function takes the transaction's connection first (``psycopg.Connection``, or
``psycopg.AsyncConnection`` for an ``async def``), then the step's arguments. It registers and
is called like any activity (``Engine(activities=[...])``, ``ctx.activity(fn, ...)``) and
appears in the history as one; what differs is how its attempt runs
(:mod:`dex.app.transaction_steps`). The connection it gets is guarded: committing, rolling
back or closing it would break the step's atomicity, so each is a terminal error naming the
step.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any, TypeVar, overload

from dex.app.registry import ACTIVITY_ATTRIBUTE
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
from dex.domain.values import TerminalError

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
    """Mark ``fn(conn, *args)`` (sync or ``async def``) as a transaction step (SPEC §9)."""
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


_ABSENT = object()


class _Guard:
    """What the guarded connections share: the step's name, whether the function misused the
    connection (remembered, so that swallowing the error does not hide it), and the attributes
    it set on the connection (its ``row_factory``, say), each with the value it replaced:
    :meth:`undo` sets them back when the function is done, before dex's own statements run on
    the connection (a ``dict_row`` left there had those statements read dicts for tuples).

    The connection's adapters too: for the step it gets a map of its own, made from its own
    (psycopg's ``AdaptersMap(template)``), so a dumper or loader the function registers on
    ``conn.adapters`` serves the function's statements and goes with the step, instead of
    staying on a pooled connection that dex's statements and other runs' steps use next."""

    _OWN = frozenset({"_conn", "_step", "misused", "_changed", "_adapters", "_cursors"})

    def __init__(self, conn: Any, step: str) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "misused", None)
        object.__setattr__(self, "_changed", {})
        object.__setattr__(self, "_adapters", _own_adapters(conn))
        object.__setattr__(self, "_cursors", _refusing_cursors(conn, self))

    def _refuse(self, what: str) -> TerminalError:
        message = (
            f"transaction step {self._step!r} called conn.{what}: the step's transaction is dex's to commit"
            " or roll back (return to commit, raise to roll back)"
        )
        object.__setattr__(self, "misused", message)
        return TerminalError(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "autocommit":
            raise self._refuse("autocommit = ...")
        changed: dict[str, Any] = self._changed
        before = getattr(self._conn, name, _ABSENT)
        setattr(self._conn, name, value)
        changed.setdefault(name, before)

    def undo(self) -> None:
        """Set back what the function set on the connection (most recent first), and its
        adapters."""
        changed: dict[str, Any] = self._changed
        for name, before in reversed(list(changed.items())):
            if before is _ABSENT:
                delattr(self._conn, name)
            else:
                setattr(self._conn, name, before)
        changed.clear()
        if self._adapters is not _ABSENT:
            self._conn._adapters = self._adapters
            object.__setattr__(self, "_adapters", _ABSENT)
        if self._cursors is not _ABSENT:
            self._conn.cursor_factory = self._cursors
            del self._conn._dex_step_guard
            object.__setattr__(self, "_cursors", _ABSENT)

    def __repr__(self) -> str:
        return f"<transaction connection of step {self._step!r}>"


def _own_adapters(conn: Any) -> Any:
    """Give ``conn`` (a psycopg connection) a map of adapters of its own, made from the one it
    has, and return that one; ``_ABSENT`` for a connection that keeps no map where psycopg's
    connections keep theirs (then nothing is swapped)."""
    adapters = getattr(conn, "adapters", None)  # psycopg makes the map on first use
    if adapters is None or not hasattr(conn, "_adapters"):
        return _ABSENT
    conn._adapters = type(adapters)(adapters)
    return adapters


def _refusing_cursors(conn: Any, guard: _Guard) -> Any:
    """Have ``conn``'s cursors (psycopg's ``cursor_factory``; ``conn.execute`` makes one too)
    refuse what ends the transaction while ``guard`` is on it, and return the factory it had;
    ``_ABSENT`` for a connection without one."""
    factory = getattr(conn, "cursor_factory", None)
    if not isinstance(factory, type):
        return _ABSENT
    conn.cursor_factory = _refusing(factory)
    conn._dex_step_guard = guard
    return factory


_REFUSING: dict[type, type] = {}  # a cursor class -> its refusing subclass, made once


def _refusing(factory: type) -> type:
    """``factory``, a cursor class, whose ``execute`` and ``executemany`` refuse a statement
    that ends the transaction while a step's guard is on the cursor's connection."""
    made = _REFUSING.get(factory)
    if made is not None:
        return made

    def check(cursor: Any, query: object, call: str) -> None:
        guard = getattr(cursor.connection, "_dex_step_guard", None)
        if guard is None:
            return
        statement = _ends_the_transaction(query, cursor.connection)
        if statement is not None:
            raise guard._refuse(_refused_call(f"cursor.{call}", query, statement))

    if inspect.iscoroutinefunction(getattr(factory, "execute", None)):

        class RefusingAsync(factory):  # type: ignore[misc]
            async def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                check(self, query, "execute")
                return await super().execute(query, *args, **kwargs)

            async def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                check(self, query, "executemany")
                return await super().executemany(query, *args, **kwargs)

        made = RefusingAsync
    else:

        class Refusing(factory):  # type: ignore[misc]
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                check(self, query, "execute")
                return super().execute(query, *args, **kwargs)

            def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                check(self, query, "executemany")
                return super().executemany(query, *args, **kwargs)

        made = Refusing
    made.__name__ = made.__qualname__ = factory.__name__  # as the function knows it
    _REFUSING[factory] = made
    return made


# a statement that ends the transaction, from where a statement of a query's text starts (after
# blanks and comments): COMMIT, END, ABORT, ROLLBACK (not ROLLBACK TO a savepoint), PREPARE TRANSACTION
_ENDS_THE_TRANSACTION = re.compile(
    r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
    r"(?P<statement>(?:COMMIT|END|ABORT)\b(?!\s+PREPARED\b)|ROLLBACK\b(?!\s+(?:TO|PREPARED)\b)|PREPARE\s+TRANSACTION\b)",
    re.IGNORECASE | re.DOTALL,
)

# what a semicolon inside does not end a statement: quoted text (E'...' with its backslashes),
# a quoted name, a dollar-quoted body, a comment; a nested comment is followed by _COMMENT_EDGES
_QUOTED = re.compile(
    r"(?<![\w$])[eE]'(?:[^'\\]|\\.|'')*'?"
    r"|'(?:[^']|'')*'?"
    r'|"(?:[^"]|"")*"?'
    r"|--[^\n]*"
    r"|(?<![\w$])\$(?P<tag>[^\W\d]\w*)?\$.*?(?:\$(?P=tag)\$|\Z)"
    r"|(?P<comment>/\*)"
    r"|;",
    re.DOTALL,
)
_COMMENT_EDGES = re.compile(r"/\*|\*/")


def _statement_starts(text: str) -> Iterator[int]:
    """Where each statement after the first of ``text`` starts: after every ``;`` that is not
    inside quotes, a dollar-quoted body or a comment (as PostgreSQL splits a simple query)."""
    position = 0
    while (found := _QUOTED.search(text, position)) is not None:
        position = found.end()
        if found.group("comment"):  # nested, as PostgreSQL's are: to the */ that closes the first
            depth = 1
            for edge in _COMMENT_EDGES.finditer(text, position):
                depth += 1 if edge.group() == "/*" else -1
                position = edge.end()
                if depth == 0:
                    break
            else:
                return
        elif found.group() == ";":
            yield position


def _as_string(query: Any, context: Any) -> str | None:
    """``query``'s text in ``context`` (the step's connection), else with no connection; None
    when it has none (then psycopg says why when the function executes it)."""
    for where in (context, None):
        try:
            return str(query.as_string(where))
        except Exception:  # noqa: BLE001 - the next way, or psycopg's error at the execute
            continue
    return None


def _ends_the_transaction(query: object, context: Any = None) -> str | None:
    """The statement of ``query`` (text, bytes or a ``psycopg.sql`` composition) that ends the
    transaction, as its first words say (``COMMIT``), behind another statement (``SELECT 1;
    COMMIT``) too; None if none does."""
    if hasattr(query, "as_string"):  # psycopg.sql.SQL, Composed...: the text it stands for
        query = _as_string(query, context)
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    if not isinstance(query, str):
        return None
    starts = _statement_starts(query) if ";" in query else ()
    for start in chain((0,), starts):  # the first statement before the text is split
        found = _ENDS_THE_TRANSACTION.match(query, start)
        if found is not None:
            return found.group("statement").upper()
    return None


def _refused_call(call: str, query: object, statement: str) -> str:
    """What the function called, named for its error: the call, the query's first characters and
    the statement that ends the transaction (which may come after them)."""
    return f"{call}({str(query).strip()[:40]!r}, which ends the transaction with {' '.join(statement.split())})"


class GuardedConnection(_Guard):
    """A transaction step's ``psycopg.Connection``: everything but ending the transaction (its
    methods, or a ``COMMIT``/``ROLLBACK`` sent through ``execute`` or a cursor's; what gets past
    this, sent through libpq itself say, the store finds after the function)."""

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        statement = _ends_the_transaction(query, self._conn)
        if statement is not None:
            raise self._refuse(_refused_call("execute", query, statement))
        return self._conn.execute(query, *args, **kwargs)

    def commit(self) -> None:
        raise self._refuse("commit()")

    def rollback(self) -> None:
        raise self._refuse("rollback()")

    def close(self) -> None:
        raise self._refuse("close()")

    def __enter__(self) -> GuardedConnection:
        raise self._refuse("__enter__ (a with block on the connection closes it)")

    def __exit__(self, *args: object) -> None:
        return None


class GuardedAsyncConnection(_Guard):
    """A transaction step's ``psycopg.AsyncConnection``, guarded as :class:`GuardedConnection`."""

    async def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        statement = _ends_the_transaction(query, self._conn)
        if statement is not None:
            raise self._refuse(_refused_call("execute", query, statement))
        return await self._conn.execute(query, *args, **kwargs)

    async def commit(self) -> None:
        raise self._refuse("commit()")

    async def rollback(self) -> None:
        raise self._refuse("rollback()")

    async def close(self) -> None:
        raise self._refuse("close()")

    async def __aenter__(self) -> GuardedAsyncConnection:
        raise self._refuse("__aenter__ (an async with block on the connection closes it)")

    async def __aexit__(self, *args: object) -> None:
        return None
