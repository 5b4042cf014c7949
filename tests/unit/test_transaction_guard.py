"""The guard on a transaction step's connection (``dex.app.transactions``): a statement that would
end dex's transaction is refused before it is sent, through the connection or one of its cursors
(the store also finds one that got past it, ``tests/integration/test_transaction_poisons.py``);
savepoints and everything else pass; an attribute the function sets, and the cursor class, are
set back by ``undo``."""

from __future__ import annotations

from typing import Any

import pytest

from dex.app.transactions import GuardedConnection
from dex.domain.values import TerminalError


class _Connection:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.row_factory = "tuples"

    def execute(self, query: Any, params: Any = None) -> str:
        self.sent.append(query)
        return "cursor"


ENDS = [
    "COMMIT",
    "  commit;",
    "-- a comment\nROLLBACK",
    "/* a\ncomment */ END",
    "abort",
    "END TRANSACTION",
    "PREPARE TRANSACTION 'x'",
    b"COMMIT",
    "COMMIT\x00",  # a NUL after it: refused all the same, and named printably
    "commit -- \ud800",  # a lone surrogate in its comment
    b"ROLLBACK \xff\xfe",  # bytes that are not UTF-8
    # behind another statement of the same text (PostgreSQL runs them all in a simple query)
    "SELECT 1; COMMIT",
    "INSERT INTO t VALUES (';'); -- a comment\n rollback",
    "SELECT $body$ ; $$ COMMIT $body$; END",  # a dollar-quoted body, with $$ inside
    "SELECT 1 /* ; /* nested ; */ ; COMMIT */; ABORT",
    "SELECT E'\\'';COMMIT'; COMMIT",  # E'' strings end at a quote not escaped by a backslash
    "SELECT $1; ROLLBACK",  # a parameter is not a dollar quote
    b"SELECT 1;COMMIT",
]
PASSES = [
    "ROLLBACK TO SAVEPOINT before_insert",
    "rollback to before_insert",
    "SAVEPOINT before_insert",
    "RELEASE SAVEPOINT before_insert",
    "INSERT INTO ending (committed) VALUES (true)",
    "SELECT 'COMMIT'",
    "COMMITTED",
    "\ud800 COMMIT",  # not a statement that ends the transaction: psycopg's to refuse
    "SELECT '\x00'",
    b"\xff\xfeCOMMIT",
    # a semicolon inside quotes, a quoted name, a dollar-quoted body or a comment ends nothing
    "SELECT ';COMMIT'",
    "SELECT 'it''s;COMMIT'",
    "SELECT E'\\';COMMIT'",
    'SELECT 1 AS "a;COMMIT"',
    "DO $$ BEGIN PERFORM 1; COMMIT; END $$",  # the server refuses that inside a transaction
    "SELECT $tag$ ; COMMIT $tag$; SELECT 2",
    "SELECT 1 /* ; /* nested ; */ ; COMMIT */; SELECT 2",
    "SELECT 1; ROLLBACK TO SAVEPOINT a; SELECT 2;",
    "SELECT 'unterminated; COMMIT",  # PostgreSQL's to refuse
]


@pytest.mark.parametrize("query", ENDS)
def test_a_statement_that_ends_the_transaction_is_refused_before_it_is_sent(query: Any) -> None:
    conn = _Connection()
    guard = GuardedConnection(conn, "record-order")
    with pytest.raises(TerminalError, match="record-order") as refused:
        guard.execute(query)
    assert conn.sent == [] and guard.misused is not None  # remembered even if the function swallows it
    assert str(refused.value).isprintable()


@pytest.mark.parametrize("query", PASSES)
def test_savepoints_and_other_statements_pass(query: Any) -> None:
    conn = _Connection()
    guard = GuardedConnection(conn, "record-order")
    assert guard.execute(query, [1]) == "cursor"
    assert conn.sent == [query] and guard.misused is None


def test_the_error_names_the_statement_that_ends_the_transaction_past_the_part_it_shows() -> None:
    guard = GuardedConnection(_Connection(), "step")
    query = "INSERT INTO orders (note) VALUES ('a note long enough to be cut'); prepare\n transaction 'x'"
    with pytest.raises(TerminalError) as refused:
        guard.execute(query)
    message = str(refused.value)
    assert "which ends the transaction with PREPARE TRANSACTION" in message and "INSERT INTO" in message


def test_a_composed_query_is_read_as_the_text_it_stands_for() -> None:
    from psycopg import sql

    conn = _Connection()
    guard = GuardedConnection(conn, "step")
    with pytest.raises(TerminalError, match=r"called conn\.execute"):
        guard.execute(sql.SQL("SELECT {}; {}").format(sql.Literal(1), sql.SQL("COMMIT")))
    assert conn.sent == []
    passes = sql.SQL("SELECT {}").format(sql.Literal(";COMMIT"))  # a value, quoted
    assert guard.execute(passes) == "cursor" and conn.sent == [passes]


def test_an_attribute_the_function_sets_is_set_back_by_undo() -> None:
    conn = _Connection()
    guard = GuardedConnection(conn, "record-order")
    guard.row_factory = "dicts"
    guard.row_factory = "namedtuples"
    guard.prepare_threshold = 0  # an attribute the connection did not have: removed again
    assert conn.row_factory == "namedtuples" and conn.prepare_threshold == 0  # type: ignore[attr-defined]
    guard.undo()
    assert conn.row_factory == "tuples" and not hasattr(conn, "prepare_threshold")


class _Cursor:
    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def execute(self, query: Any, params: Any = None) -> str:
        self.connection.sent.append(query)
        return "executed"

    def executemany(self, query: Any, params: Any) -> str:
        self.connection.sent.append(query)
        return "executed many"


class _AsyncCursor(_Cursor):
    async def execute(self, query: Any, params: Any = None) -> str:  # type: ignore[override]
        self.connection.sent.append(query)
        return "executed"

    async def executemany(self, query: Any, params: Any) -> str:  # type: ignore[override]
        self.connection.sent.append(query)
        return "executed many"


class _CursorConnection(_Connection):
    """A connection that makes its cursors with ``cursor_factory``, as psycopg's do."""

    def __init__(self, factory: type) -> None:
        super().__init__()
        self.cursor_factory = factory

    def cursor(self) -> Any:
        return self.cursor_factory(self)


@pytest.mark.parametrize("query", ENDS)
def test_a_cursor_of_the_connection_refuses_what_ends_the_transaction(query: Any) -> None:
    conn = _CursorConnection(_Cursor)
    guard = GuardedConnection(conn, "step")
    for call in ("execute", "executemany"):
        with pytest.raises(TerminalError, match=rf"transaction step 'step' called conn\.cursor\.{call}\("):
            getattr(guard.cursor(), call)(query, [])
    assert conn.sent == [] and guard.misused is not None
    assert guard.cursor().execute("SELECT 1") == "executed"  # everything else passes
    assert isinstance(guard.cursor(), _Cursor)  # still the class the connection makes
    guard.undo()
    assert conn.cursor_factory is _Cursor and not hasattr(conn, "_dex_step_guard")
    assert conn.cursor().execute(query) == "executed"  # dex's own statements after the step


def test_an_async_cursor_refuses_what_ends_the_transaction() -> None:
    import asyncio

    conn = _CursorConnection(_AsyncCursor)
    guard = GuardedConnection(conn, "step")
    with pytest.raises(TerminalError, match=r"called conn\.cursor\.execute"):
        asyncio.run(guard.cursor().execute("ROLLBACK"))
    assert asyncio.run(guard.cursor().execute("SAVEPOINT a")) == "executed"
    guard.undo()
    assert conn.cursor_factory is _AsyncCursor and conn.sent == ["SAVEPOINT a"]
