"""The connections transaction steps run on: real psycopg connections that refuse to end the
step's transaction while its function holds them.

A ``@dex.transaction`` step's function gets the very connection its transaction runs on: a
:class:`StepConnection` (a ``psycopg.Connection``) or, for an ``async def``, a
:class:`StepAsyncConnection` (a ``psycopg.AsyncConnection``). So ``isinstance`` holds and every
psycopg API and library that takes a connection takes it, ``engine.start_workflow(...,
connection=conn)`` included. The adapter opens them itself (:mod:`.step_sessions`,
:mod:`.async_sessions`) with psycopg's public ``connect`` of a subclass and its
``cursor_factory=``, so nothing of psycopg's is replaced at run time.

While a step holds one (:func:`run_held`, :func:`run_held_async`), what would end dex's
transaction is refused with a terminal error naming the step, remembered even when the function
swallows it: ``commit()``, ``rollback()``, ``close()``, ``with conn:`` (its end commits and
closes), the two-phase calls, ``autocommit``, and a ``COMMIT``/``ROLLBACK``/``END``/``ABORT``/
``PREPARE TRANSACTION`` statement sent through ``execute`` of the connection or of one of its
default cursors (behind another statement of the same text too). What gets past that (a cursor
class of the function's own, libpq itself) the store finds once the function returned: its
transaction is no longer the one dex began (:mod:`.transactions`). Savepoints pass (``with
conn.transaction():`` inside the step is one).

What the function sets on the connection object (``conn.row_factory = dict_row``, say) serves
its own statements and is set back when it returns, before dex's statements run on the
connection; the dumpers and loaders it registers on ``conn.adapters`` go to a map of the step's
own (psycopg's public ``AdaptersMap(template)``), which its cursors use and which goes with the
step.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from itertools import chain
from typing import Any, TypeVar

import psycopg
from psycopg.adapt import AdaptersMap

from dex.app.ports.store import StepFailed
from dex.domain.values import TerminalError

T = TypeVar("T")

_ABSENT = object()


class _Hold:
    """A step's hold on its connection: its name, the misuse it was refused (kept, so that
    swallowing the error does not hide it), the public attributes it set with the values they
    replaced, and its own map of adapters (made when first asked for)."""

    __slots__ = ("adapters", "changed", "misused", "step")

    def __init__(self, step: str) -> None:
        self.step = step
        self.misused: str | None = None
        self.changed: dict[str, object] = {}
        self.adapters: AdaptersMap | None = None

    def refuse(self, what: str) -> TerminalError:
        self.misused = (
            f"transaction step {self.step!r} called conn.{what}: the step's transaction is dex's to commit"
            " or roll back (return to commit, raise to roll back)"
        )
        return TerminalError(self.misused)

    def check(self, query: object, call: str, context: Any) -> None:
        statement = ends_the_transaction(query, context)
        if statement is not None:
            raise self.refuse(_refused_call(call, query, statement))


class _Holdable:
    """What both connection classes share: the hold, the attributes set under it, and the
    adapters. A class attribute ``_hold`` is None while no step holds the connection, so
    psycopg's own attributes, set in its ``__init__`` and as it works, cost one test."""

    _hold: _Hold | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        hold = self._hold
        if hold is not None and not name.startswith("_"):  # psycopg's own state is its business
            if name == "autocommit":
                raise hold.refuse("autocommit = ...")
            before = getattr(self, name, _ABSENT)
            super().__setattr__(name, value)
            hold.changed.setdefault(name, before)  # once set: a refused one has nothing to set back
            return
        super().__setattr__(name, value)

    @property
    def adapters(self) -> AdaptersMap:
        hold = self._hold
        own: AdaptersMap = super().adapters  # type: ignore[misc]
        if hold is None:
            return own
        if hold.adapters is None:
            hold.adapters = AdaptersMap(own)
        return hold.adapters

    def _take(self, step: str) -> _Hold:
        if self._hold is not None:
            raise RuntimeError(f"the connection is held by transaction step {self._hold.step!r} already")
        hold = _Hold(step)
        object.__setattr__(self, "_hold", hold)
        return hold

    def _release(self) -> None:
        """Set back what the step set (most recent first) and end its hold."""
        hold = self._hold
        object.__setattr__(self, "_hold", None)
        if hold is None:
            return
        for name, before in reversed(list(hold.changed.items())):
            if before is _ABSENT:
                delattr(self, name)
            else:
                setattr(self, name, before)

    def _refusing(self, what: str) -> None:
        hold = self._hold
        if hold is not None:
            raise hold.refuse(what)


class StepCursor(psycopg.Cursor[Any]):
    """The default cursor of a :class:`StepConnection`: refuses a statement that ends the
    transaction while a step holds the connection."""

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = getattr(self.connection, "_hold", None)
        if hold is not None:
            hold.check(query, "cursor.execute", self.connection)
        return super().execute(query, *args, **kwargs)

    def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = getattr(self.connection, "_hold", None)
        if hold is not None:
            hold.check(query, "cursor.executemany", self.connection)
        return super().executemany(query, *args, **kwargs)


class StepAsyncCursor(psycopg.AsyncCursor[Any]):
    """The default cursor of a :class:`StepAsyncConnection`, refusing as :class:`StepCursor`."""

    async def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = getattr(self.connection, "_hold", None)
        if hold is not None:
            hold.check(query, "cursor.execute", self.connection)
        return await super().execute(query, *args, **kwargs)

    async def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = getattr(self.connection, "_hold", None)
        if hold is not None:
            hold.check(query, "cursor.executemany", self.connection)
        return await super().executemany(query, *args, **kwargs)


class StepConnection(_Holdable, psycopg.Connection[Any]):
    """A synchronous step's connection (see the module's docstring); open it with
    ``StepConnection.connect(conninfo, cursor_factory=StepCursor)``."""

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = self._hold
        if hold is not None:
            hold.check(query, "execute", self)
        return super().execute(query, *args, **kwargs)

    def commit(self) -> None:
        self._refusing("commit()")
        super().commit()

    def rollback(self) -> None:
        self._refusing("rollback()")
        super().rollback()

    def close(self) -> None:
        self._refusing("close()")
        super().close()

    def __enter__(self) -> Any:
        self._refusing("__enter__ (a with block on the connection commits and closes it)")
        return super().__enter__()

    def tpc_prepare(self) -> None:
        self._refusing("tpc_prepare()")
        super().tpc_prepare()

    def tpc_commit(self, xid: Any = None) -> None:
        self._refusing("tpc_commit()")
        super().tpc_commit(xid)

    def tpc_rollback(self, xid: Any = None) -> None:
        self._refusing("tpc_rollback()")
        super().tpc_rollback(xid)


class StepAsyncConnection(_Holdable, psycopg.AsyncConnection[Any]):
    """An ``async def`` step's connection, refusing as :class:`StepConnection`; open it with
    ``StepAsyncConnection.connect(conninfo, cursor_factory=StepAsyncCursor)``."""

    async def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        hold = self._hold
        if hold is not None:
            hold.check(query, "execute", self)
        return await super().execute(query, *args, **kwargs)

    async def commit(self) -> None:
        self._refusing("commit()")
        await super().commit()

    async def rollback(self) -> None:
        self._refusing("rollback()")
        await super().rollback()

    async def close(self) -> None:
        self._refusing("close()")
        await super().close()

    async def __aenter__(self) -> Any:
        self._refusing("__aenter__ (an async with block on the connection commits and closes it)")
        return await super().__aenter__()

    async def set_autocommit(self, value: bool) -> None:
        self._refusing("set_autocommit()")
        await super().set_autocommit(value)

    async def tpc_prepare(self) -> None:
        self._refusing("tpc_prepare()")
        await super().tpc_prepare()

    async def tpc_commit(self, xid: Any = None) -> None:
        self._refusing("tpc_commit()")
        await super().tpc_commit(xid)

    async def tpc_rollback(self, xid: Any = None) -> None:
        self._refusing("tpc_rollback()")
        await super().tpc_rollback(xid)


def _held(conn: object) -> _Holdable:
    if not isinstance(conn, _Holdable):  # a bug of the adapter's: every step's connection is one
        raise TypeError(f"a transaction step runs on a step connection, got {type(conn).__name__}")
    return conn


def _released(conn: _Holdable, hold: _Hold) -> None:
    """End the hold; what cannot be set back, or a misuse the function swallowed, fails the
    attempt (its transaction rolls back) before dex's statements run on the connection."""
    try:
        conn._release()
    except Exception as exc:  # noqa: BLE001 - the connection is not as dex left it: the attempt fails
        raise StepFailed(exc) from None
    if hold.misused is not None:
        raise StepFailed(TerminalError(hold.misused))


def run_held(conn: object, step: str, work: Callable[[Any], T]) -> T:
    """``work(conn)`` with ``conn`` held by the step named ``step`` (see the module's docstring)."""
    held = _held(conn)
    hold = held._take(step)
    try:
        result = work(conn)
    except StepFailed:
        _released(held, hold)  # a misuse the function swallowed comes first: it is terminal
        raise
    except BaseException:
        held._release()
        raise
    _released(held, hold)
    return result


async def run_held_async(conn: object, step: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """``await work(conn)`` with ``conn`` held, as :func:`run_held`."""
    held = _held(conn)
    hold = held._take(step)
    try:
        result = await work(conn)
    except StepFailed:
        _released(held, hold)
        raise
    except BaseException:
        held._release()
        raise
    _released(held, hold)
    return result


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


def ends_the_transaction(query: object, context: Any = None) -> str | None:
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
