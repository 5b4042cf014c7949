"""Arrays packed in PostgreSQL's binary format (dex.adapters.postgres.arrays) read back on the
server as the values packed: sent as parameters (binary, text) and written as literals."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from dex.adapters.postgres import arrays


@pytest.fixture(scope="module")
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        arrays.register(connection)
        yield connection


text = st.text(
    st.sampled_from("\"\\,{} 'NULLü") | st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=10,
)
# aware, in any fixed offset (a year from 2 on: the year 1 in UTC+x would be before year 1 in UTC)
moments = st.datetimes(
    min_value=datetime(2, 1, 1),
    timezones=st.builds(timezone, st.timedeltas(-timedelta(hours=23, minutes=59), timedelta(hours=23, minutes=59))),
)
CASES: dict[str, tuple[Callable[[Any], bytes], st.SearchStrategy[Any]]] = {
    "text": (arrays.texts, st.lists(st.none() | text, max_size=6)),
    "integer": (arrays.int4s, st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6)),
    "bigint": (arrays.int8s, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6)),
    "boolean": (arrays.bools, st.lists(st.booleans(), max_size=6)),
    "bytea": (arrays.byteas, st.lists(st.none() | st.binary(max_size=8), max_size=6)),
    "timestamptz": (arrays.timestamptzs, st.lists(moments, max_size=6)),
    "interval": (arrays.intervals, st.lists(st.timedeltas(-timedelta(days=10**6), timedelta(days=10**6)), max_size=6)),
}


def read_back(conn: psycopg.Connection, type_name: str, placeholder: str, packed: bytes) -> list[Any]:
    query = sql.SQL("SELECT {}::{}[]").format(sql.SQL(placeholder), sql.SQL(type_name))
    row = conn.execute(query, [packed]).fetchone()
    assert row is not None
    return list(row[0])


@pytest.mark.parametrize("type_name", sorted(CASES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_array_reads_back_as_packed(conn: psycopg.Connection, type_name: str, data: st.DataObject) -> None:
    pack, elements = CASES[type_name]
    items: Sequence[Any] = data.draw(elements)
    packed = pack(items)
    assert arrays.values(packed) == list(items)
    for placeholder in ("%b", "%t", "%s"):
        assert read_back(conn, type_name, placeholder, packed) == list(items), placeholder
    # as a literal, as client-side binding and the query-plan tests write it
    literal = sql.Literal(packed).as_string(conn)
    row = conn.execute(sql.SQL("SELECT {}").format(sql.SQL(literal))).fetchone()
    assert row is not None and list(row[0]) == list(items)


def test_a_value_out_of_range_is_refused_before_sending() -> None:
    with pytest.raises(struct.error):
        arrays.int4s([2**31])
    with pytest.raises(struct.error):
        arrays.int8s([-(2**63) - 1])


def test_a_naive_moment_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        arrays.timestamptzs([datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1)])


def test_an_interval_goes_as_psycopg_sends_a_timedelta(conn: psycopg.Connection) -> None:
    """Days stay days (not 24 hours each), as psycopg sends them: the same interval, not just an
    equal one, so that adding it to a time across a DST change gives what it gave before."""
    deltas = [timedelta(days=3, seconds=7), timedelta(days=-1, microseconds=1)]
    row = conn.execute(
        "SELECT %b::interval[]::text, %s::interval[]::text", [arrays.intervals(deltas), deltas]
    ).fetchone()
    assert row is not None and row[0] == row[1]
