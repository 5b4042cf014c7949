"""What refuses to end a transaction step's transaction, without a database:

* the PostgreSQL adapter's reading of a statement (``step_connections.ends_the_transaction``):
  a statement that would end dex's transaction is found wherever it stands in the text, and
  savepoints and everything else pass (the real connections refuse them before they are sent:
  ``tests/integration/test_transaction_connections.py``, ``test_transaction_poisons.py``);
* the in-memory adapter's stand-in for the factory's connection (``memory.step_connection``):
  commit, rollback, close and ``with`` refused with a terminal error naming the step, remembered
  when the function swallows it, and everything else handed through to whatever object the
  factory returned."""

from __future__ import annotations

from typing import Any

import pytest

from dex.adapters.memory.step_connection import run_held
from dex.adapters.postgres.step_connections import ends_the_transaction
from dex.app.ports.store import StepFailed
from dex.domain.values import TerminalError

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
def test_a_statement_that_ends_the_transaction_is_found(query: Any) -> None:
    assert ends_the_transaction(query) is not None


@pytest.mark.parametrize("query", PASSES)
def test_savepoints_and_other_statements_pass(query: Any) -> None:
    assert ends_the_transaction(query) is None


def test_the_statement_found_is_named_past_the_first_characters() -> None:
    query = "INSERT INTO orders (note) VALUES ('a note long enough to be cut'); prepare\n transaction 'x'"
    assert ends_the_transaction(query) == "PREPARE\n TRANSACTION"


def test_a_composed_query_is_read_as_the_text_it_stands_for() -> None:
    from psycopg import sql

    assert ends_the_transaction(sql.SQL("SELECT {}; {}").format(sql.Literal(1), sql.SQL("COMMIT"))) == "COMMIT"
    assert ends_the_transaction(sql.SQL("SELECT {}").format(sql.Literal(";COMMIT"))) is None  # a value, quoted


class _Factory:
    """Whatever a test's factory returns: here, no driver at all; its ``adapters`` and
    ``_adapters`` (which the guard in the application layer once replaced, and failed on) are
    not the stand-in's business."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.ended: list[str] = []

    @property
    def adapters(self) -> object:
        raise RuntimeError("not a psycopg connection")

    @property
    def _adapters(self) -> object:
        raise RuntimeError("not a psycopg connection")

    def execute(self, query: str) -> str:
        self.sent.append(query)
        return "cursor"

    def commit(self) -> None:
        self.ended.append("commit")


@pytest.mark.parametrize("how", ["commit", "rollback", "close", "__enter__", "__aenter__"])
def test_the_memory_stand_in_refuses_what_ends_the_transaction_even_when_swallowed(how: str) -> None:
    conn = _Factory()

    def work(held: Any) -> str:
        held.execute("INSERT 1")
        with pytest.raises(TerminalError, match=rf"transaction step 'record-order' called conn\.{how}"):
            getattr(held, how)()
        return "swallowed"

    with pytest.raises(StepFailed) as failed:
        run_held(conn, "record-order", work)
    assert isinstance(failed.value.cause, TerminalError) and "record-order" in str(failed.value.cause)
    assert conn.sent == ["INSERT 1"] and conn.ended == []  # the adapter's to commit, not the step's


def test_the_memory_stand_in_hands_everything_else_through() -> None:
    conn = _Factory()

    def work(held: Any) -> Any:
        held.note = "set on the factory's connection"
        return held.execute("SELECT 1")

    assert run_held(conn, "step", work) == "cursor"
    assert conn.note == "set on the factory's connection"  # type: ignore[attr-defined]
    assert run_held(None, "step", lambda held: held) is None  # no factory: nothing to hold
