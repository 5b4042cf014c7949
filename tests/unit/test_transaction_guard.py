"""The guard on a transaction step's connection (``dex.app.transactions``): a statement that would
end dex's transaction is refused before it is sent (the store also finds one that got past it,
``tests/integration/test_transaction_poisons.py``); savepoints and everything else pass; an
attribute the function sets is set back by ``undo``."""

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


def test_an_attribute_the_function_sets_is_set_back_by_undo() -> None:
    conn = _Connection()
    guard = GuardedConnection(conn, "record-order")
    guard.row_factory = "dicts"
    guard.row_factory = "namedtuples"
    guard.prepare_threshold = 0  # an attribute the connection did not have: removed again
    assert conn.row_factory == "namedtuples" and conn.prepare_threshold == 0  # type: ignore[attr-defined]
    guard.undo()
    assert conn.row_factory == "tuples" and not hasattr(conn, "prepare_threshold")
