"""Telling refused data from an unavailable server, for the writes the engine's buffer makes.

The buffer writes task results, activity outcomes, events and heartbeats in batches. When
PostgreSQL (or psycopg, encoding a parameter) refuses a batch for a value in it, sending the
same batch again fails the same way forever; the buffer must split it to find the item and
settle that item alone. When the server is unavailable (a connection cut, a timeout, a pool
that has no connection), the whole batch is kept for the next flush. :func:`refusals` turns
the first kind into :class:`~dex.app.ports.store.StoreRejectedError` and lets everything else
through unchanged.

What counts as refused data:

- ``DataError`` (SQLSTATE class 22: a NUL or an invalid byte sequence in text, a number out
  of range, a value too long), raised by the server or by psycopg while dumping a parameter;
- ``IntegrityError`` (class 23: a constraint the row breaks);
- ``ProgramLimitExceeded`` (54000: a value too large for an index row or an array);
- ``UnicodeEncodeError`` (a lone surrogate in a str, found when it is encoded for the wire)
  and ``struct.error`` (an int out of range for a packed array, :mod:`.arrays`).

Between the two lies an error the server answers for a statement of the batch that is not a
value it cannot hold: a bug of dex's statements for one shape of result (a row written twice by
one ``ON CONFLICT DO UPDATE``, SQLSTATE 21000, once held every run's writes for ever), a trigger
an operator added that raises (P0001), a type or feature a statement meets for one item.
:func:`batch_refusals`, around the buffer's writes, raises those as
:class:`~dex.app.ports.store.StoreWriteError`: the buffer splits the batch as for refused data,
but retries the item that fails alone, with a backoff, rather than failing its run. Which
errors: the SQLSTATE classes of :data:`ANSWERED_FOR_THE_DATA` (feature not supported, triggered
action, cardinality, triggered data change, routine exceptions, syntax and access rules, check
option, PL/pgSQL). Not the server's own failures, whatever the batch (connection exceptions,
a read-only transaction on a standby after a failover, rollbacks for serialization or deadlock,
insufficient resources, locks, a cancel or a shutdown, system and internal errors), nor a table
dropped, a schema gone or a privilege revoked (42P01, 3F000, 42501): those fail every batch
alike, and the batch waits whole, as for an unavailable server. An exception that is no answer
of the server (no SQLSTATE) is left alone too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg.errors

from dex.app.ports.store import StoreRejectedError, StoreWriteError

REFUSED_DATA: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    psycopg.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
    UnicodeEncodeError,
    struct.error,
)


@contextmanager
def refusals() -> Iterator[None]:
    """Around a write (outside its transaction, which has rolled back by then): refused data
    raises StoreRejectedError, which names what PostgreSQL said."""
    try:
        yield
    except REFUSED_DATA as exc:
        raise StoreRejectedError(f"PostgreSQL refused the data ({type(exc).__name__}: {_text(exc)})") from exc


ANSWERED_FOR_THE_DATA = ("0A", "09", "21", "27", "2F", "38", "39", "42", "44", "P0")
"""SQLSTATE classes (their first two characters) of an error the server answers for what a
statement was given, beyond refused data: :func:`batch_refusals` raises them as StoreWriteError."""
EVERY_BATCH_ALIKE = frozenset({"42P01", "42501", "3F000"})
"""Of those, a table dropped, a privilege revoked (and a schema gone): no batch gets through."""


@contextmanager
def batch_refusals() -> Iterator[None]:
    """Around a write of the buffer's batches: :func:`refusals`, and an error the server answered
    for the batch's statements (:data:`ANSWERED_FOR_THE_DATA`) raises StoreWriteError, which the
    buffer answers by splitting the batch (the module docstring)."""
    try:
        with refusals():
            yield
    except psycopg.Error as exc:
        if not answered_for_the_data(exc):
            raise
        raise StoreWriteError(f"PostgreSQL failed the write ({type(exc).__name__}: {_text(exc)})") from exc


def answered_for_the_data(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is the server's answer to a statement of the batch, for what it was given
    (not its own failure, nor one every batch meets alike)."""
    state = exc.sqlstate
    if state is None or state in EVERY_BATCH_ALIKE:
        return False
    return state.startswith(ANSWERED_FOR_THE_DATA)


def _text(exc: BaseException) -> str:
    if isinstance(exc, UnicodeEncodeError):  # its str() repeats the whole offending value
        return f"{exc.reason} at position {exc.start}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""
