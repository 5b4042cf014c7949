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

``ProgrammingError`` (class 42) is *not* refused data, although a write raises it: a table
that was dropped or a privilege that was revoked refuses every batch alike, so splitting would
fail every run in it; the batch waits instead, as for an unavailable server.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg.errors

from dex.app.ports.store import StoreRejectedError

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


def _text(exc: BaseException) -> str:
    if isinstance(exc, UnicodeEncodeError):  # its str() repeats the whole offending value
        return f"{exc.reason} at position {exc.start}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""
