"""A completion's pipelined transaction (``dex/adapters/postgres/dispatch.py`` ``begin``).

``BEGIN`` and ``COMMIT`` go out as statements of the pipeline, so the block's statements are
sent without waiting for ``BEGIN``'s answer. Here, on a real server:

- a block that reads once costs two exchanges with the server (the read, then the commit
  with everything after it), not three;
- what the block wrote is committed, and the connection is idle afterwards;
- a statement the server fails, an exception of the caller's code (one that cannot even be
  printed) and a ``KeyboardInterrupt`` each leave nothing written and an idle connection,
  which the next transaction uses as usual;
- a connection that cannot be rolled back is closed (its pool replaces it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus

from dex.adapters.postgres.dispatch import begin


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.fixture
def conn(pg_dsn: str, pg_schema: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY)")
        yield conn


def _ids(conn: psycopg.Connection) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM t ORDER BY id").fetchall()]


def _exchanges(trace: Path) -> int:
    """How many times the client sent messages and then read the server's (libpq's protocol
    trace: each switch from sending to receiving is one round trip)."""
    directions = [line.split("\t")[1] for line in trace.read_text().splitlines() if line.count("\t") >= 2]
    return sum(1 for before, after in itertools.pairwise(directions) if (before, after) == ("F", "B"))


def test_a_block_that_reads_once_costs_two_exchanges_and_commits(conn: psycopg.Connection, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with trace.open("w") as out:
        conn.pgconn.trace(out.fileno())
        with begin(conn, pipeline=True):
            conn.execute("INSERT INTO t VALUES (1)")
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)  # its own write, in its transaction
            conn.execute("INSERT INTO t VALUES (2)")
        conn.pgconn.untrace()
    assert _exchanges(trace) == 2
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert _ids(conn) == [1, 2]


def test_a_failing_statement_writes_nothing_and_leaves_the_connection_usable(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.UniqueViolation), begin(conn, pipeline=True):
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (2)")
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert _ids(conn) == []
    with begin(conn, pipeline=True):  # the healthy write after it
        conn.execute("INSERT INTO t VALUES (3)")
    assert _ids(conn) == [3]


@pytest.mark.parametrize("raised", [_Unprintable, KeyboardInterrupt], ids=["unprintable", "keyboard-interrupt"])
def test_an_exception_in_the_block_writes_nothing(conn: psycopg.Connection, raised: type[BaseException]) -> None:
    with pytest.raises(raised), begin(conn, pipeline=True):
        conn.execute("INSERT INTO t VALUES (1)")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # sent, and the insert with it
        raise raised()
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert _ids(conn) == []
    with begin(conn, pipeline=True):
        conn.execute("INSERT INTO t VALUES (2)")
    assert _ids(conn) == [2]


def test_a_connection_that_cannot_roll_back_is_closed(conn: psycopg.Connection, pg_dsn: str) -> None:
    pid = conn.info.backend_pid
    with pytest.raises(psycopg.OperationalError), begin(conn, pipeline=True):
        conn.execute("INSERT INTO t VALUES (1)")
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        conn.execute("SELECT 1").fetchone()
    assert conn.closed
