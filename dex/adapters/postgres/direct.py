"""One statement on the hottest path, executed through libpq directly.

``start_workflow`` is the one call an application makes once per run, one after another, and
in the throughput batch the loop of starts is what bounds the rate: each of its microseconds
of Python is a microsecond on that path. psycopg's ``execute`` spends ~35 µs of CPU on the
start's eighteen parameters and its result row (adapting each value, the prepared-statement
bookkeeping, the cursor and its result loaders) around libpq's ~20 µs: the start's statement
took ~63 µs of client CPU that way and ~40 µs this way, the values' encoding included. A
:class:`DirectStatement` sends its statement with its parameter types fixed and the values
as bytes the caller encoded (text, or binary for ``bytea``), and hands back libpq's result,
whose text values the caller reads itself.

Outside a transaction (the kept connection, in autocommit, where an application's loop of
starts runs) the statement is prepared on the session once and then executed by name: parsing
``SELECT ... FROM create_run($1, ..., $19)`` at every start cost the server ~40 µs of its
~230 µs per start (``benchmarks.server_cpu``). A session can lose it: psycopg sends
``DEALLOCATE ALL`` after the rollback of any transaction on a connection where psycopg had
prepared statements of its own, and a pool's reset may ``DISCARD ALL``. Outside a transaction
that loss is harmless: the execution fails with ``invalid_sql_statement_name`` having done
nothing, and the statement is prepared again and executed once more. Inside a transaction (an
application's ``connection=``, a schedule's fire) a failed execution would abort the caller's
transaction, so there the statement is always sent unnamed (libpq's ``PQexecParams``: parse,
bind and execute in one exchange) and nothing of it stays on the session.

The connection is psycopg's (the one kept for starts, or a pooled one), in autocommit or
inside the caller's transaction, and no other thread uses it meanwhile; the statement still
takes psycopg's lock on it, as psycopg's ``execute`` does. libpq releases the GIL while it
waits, as psycopg does.

This is the one module of dex that uses psycopg's internals (``psycopg.errors.error_from_result``
and ``conn.lock``, neither documented; ``conn.pgconn`` and its ``exec_params`` are psycopg's
documented libpq wrapper). It is used only with the psycopg versions it was checked against
(:data:`CHECKED`); with any other, :data:`AVAILABLE` is false, a warning says so once, and
starts take the public path (``runs.create_run``: psycopg's ``execute``, prepared). Measured
with ``benchmarks.start_loop -n 3000`` (engine not started; the starting thread's CPU per
start, eight alternated triples on a shared two-core machine): 0.194 ms with the statement
prepared as it was, 0.195 ms unnamed, 0.270 ms on the public path (+39 %;
docs/decisions/start-through-libpq.md), over the 10 % that would retire this module.

An error result raises the exception psycopg would have raised for it
(``psycopg.errors.UniqueViolation`` and so on).

libpq reads a parameter in text form as a C string: a NUL in it would end the value there,
and ``"a\\x00b"`` would be stored as ``"a"`` (an instance id that collides with another). So a
text parameter holding a NUL is refused before anything is sent: ``StoreRejectedError``
naming the field, as PostgreSQL refuses a NUL in text everywhere else (the engine refuses
it where it enters, at ``start_workflow``; this is the adapter's own guard).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result

from dex.adapters.postgres import arrays
from dex.app.ports.store import StoreRejectedError

log = logging.getLogger(__name__)

# the psycopg versions this module was checked against (from, up to but excluding): it uses
# psycopg.pq's PGconn.exec_params on ``conn.pgconn``, psycopg.errors.error_from_result (not
# documented) and ``conn.lock`` (not documented)
CHECKED = ((3, 3), (3, 4))


def supported(version: str) -> bool:
    """Whether psycopg ``version`` is in :data:`CHECKED`; a warning names it when not."""
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        release = ()
    if CHECKED[0] <= release < CHECKED[1]:
        return True
    log.warning(
        "psycopg %s is outside the range dex's direct start statement was checked against (%s to %s): "
        "starts go through psycopg's execute instead",
        version,
        ".".join(map(str, CHECKED[0])),
        ".".join(map(str, CHECKED[1])),
    )
    return False


AVAILABLE = supported(psycopg.__version__)

# type oids (pg_type), fixed when the statement is prepared
TEXT, INT4, BOOL, BYTEA, TIMESTAMPTZ, JSONB, TEXT_ARRAY = 25, 23, 16, 17, 1184, 3802, 1009
_BINARY = {BYTEA}  # bytea goes as its raw bytes; every other value as its text form

Param = bytes | None


_INVALID_STATEMENT_NAME = "26000"  # the session does not know the prepared statement's name


class DirectStatement:
    """A statement with fixed parameter types: prepared once on a session outside a transaction,
    sent unnamed inside one (see the module's text). ``name`` names it in errors; ``fields``
    name the parameters in errors (``$1``, ``$2``, ... without it)."""

    def __init__(self, name: str, query: bytes, types: Sequence[int], fields: Sequence[str] = ()) -> None:
        self.name = name
        self.query = query
        self.types = list(types)
        if fields and len(fields) != len(self.types):
            raise ValueError(f"{name}: {len(self.types)} field names expected, got {len(fields)}")
        self.fields = list(fields) or [f"${n}" for n in range(1, len(self.types) + 1)]
        self.formats = [1 if oid in _BINARY else 0 for oid in self.types]
        self._encoders = [_ENCODERS[oid] for oid in self.types]
        # the session's name of the prepared form: the text's digest, so that two statements
        # (two schemas' starts) on one session never share a name
        self._prepared_name = b"dex_" + hashlib.sha256(query).hexdigest()[:24].encode()
        # the connections (sessions) it was prepared on; a connection the pool drops drops out.
        # Each connection is used by one thread at a time, the set by all of them: its lock
        self._prepared_on: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()
        self._prepared_lock = threading.Lock()

    def execute(self, conn: psycopg.Connection, params: Sequence[Param]) -> pq.abc.PGresult:
        """Run the statement on ``conn`` (which no other thread uses meanwhile) and return its
        result; raise psycopg's exception for an error. Prepared on the session when ``conn``
        is outside a transaction, sent unnamed inside one."""
        self.check(params)
        values = cast("Sequence[bytes]", params)  # libpq takes None for NULL; psycopg's stubs omit it
        # psycopg's own lock on the connection, as its execute takes it: the caller holds the
        # connection alone (KeptConnection, or checked out of the pool), so it is never
        # contended, and costs a fraction of a microsecond
        with conn.lock:
            pgconn = conn.pgconn
            if pgconn.transaction_status != pq.TransactionStatus.IDLE:
                result = pgconn.exec_params(self.query, values, self.types, self.formats)
            else:
                result = self._execute_prepared(conn, values)
        if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise error_from_result(result, encoding=conn.info.encoding)
        return result

    def _execute_prepared(self, conn: psycopg.Connection, values: Sequence[bytes]) -> pq.abc.PGresult:
        """Execute by name on an idle session, preparing first where this session has not got
        it (or lost it: then the execution did nothing, outside any transaction, and is made
        once more after preparing again)."""
        pgconn = conn.pgconn
        for _ in range(2):
            with self._prepared_lock:
                known = conn in self._prepared_on
            if not known:
                prepared = pgconn.prepare(self._prepared_name, self.query, self.types)
                if prepared.status != pq.ExecStatus.COMMAND_OK:
                    return prepared  # the caller raises its error
                with self._prepared_lock:
                    self._prepared_on.add(conn)
            result = pgconn.exec_prepared(self._prepared_name, values, self.formats)
            if result.status != pq.ExecStatus.FATAL_ERROR or _sqlstate(result) != _INVALID_STATEMENT_NAME:
                return result
            with self._prepared_lock:
                self._prepared_on.discard(conn)
        return result

    def encode(self, values: Sequence[object]) -> list[Param]:
        """``values`` (Python values, one per parameter, in order) in the form this statement
        sends them: the text form of each parameter's type, bytes as they are (:func:`encode`)."""
        return [
            encoder(value) if value is not None else None for encoder, value in zip(self._encoders, values, strict=True)
        ]

    def check(self, params: Sequence[Param]) -> None:
        """Refuse ``params`` before anything is sent: a wrong count (``ValueError``), or a NUL
        in a text value (``StoreRejectedError`` naming its field)."""
        if len(params) != len(self.types):
            raise ValueError(f"{self.name}: {len(self.types)} parameters expected, got {len(params)}")
        for field, form, param in zip(self.fields, self.formats, params, strict=True):
            if form == 0 and param is not None and b"\x00" in param:
                raise StoreRejectedError(_nul(field))


def _sqlstate(result: pq.abc.PGresult) -> str:
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    return state.decode("ascii", "replace") if state else ""


def _nul(field: str) -> str:
    return f"{field} contains a NUL character (\\x00), which PostgreSQL cannot store in text"


# -- values as PostgreSQL reads them in text form ---------------------------------------------
def text(value: str | None) -> Param:
    return value.encode() if value is not None else None


def int4(value: int) -> bytes:
    return b"%d" % value


def boolean(value: bool) -> bytes:
    return b"t" if value else b"f"


def timestamptz(value: datetime | None) -> Param:
    """ISO 8601; a naive value is read in the session's time zone (UTC), as psycopg's would be."""
    return value.isoformat().encode() if value is not None else None


def jsonb_object(pairs: Iterable[tuple[str, str]], field: str = "a JSON object") -> bytes:
    """A JSON object of string pairs (most runs have no labels: ``{}`` without encoding).

    A NUL in a key or a value is refused (``StoreRejectedError`` naming ``field``): JSON
    escapes it as ``\\u0000``, which ``jsonb`` cannot hold either."""
    if not pairs:
        return b"{}"
    mapping = dict(pairs)
    if any("\x00" in key or "\x00" in value for key, value in mapping.items()):
        raise StoreRejectedError(_nul(field))
    return json.dumps(mapping, ensure_ascii=False).encode()


def text_array(values: Sequence[str] | None) -> Param:
    """An array literal (:func:`arrays.text_literal`)."""
    return arrays.text_literal(values).encode() if values is not None else None


# the encoding of a value (never None: that is NULL) of each parameter type a statement here
# takes (a jsonb parameter: its JSON text)
_ENCODERS: dict[int, Callable[[Any], Param]] = {
    TEXT: str.encode,
    INT4: int4,
    BOOL: boolean,
    BYTEA: bytes,
    TIMESTAMPTZ: timestamptz,
    JSONB: str.encode,
    TEXT_ARRAY: text_array,
}


def encode(oid: int, value: object) -> Param:
    """A Python value as a parameter of type ``oid`` is sent (None: NULL)."""
    return _ENCODERS[oid](value) if value is not None else None


def value(result: pq.abc.PGresult, column: int) -> str | None:
    """The first row's value in ``column`` as text (None for NULL)."""
    raw = result.get_value(0, column)
    return raw.decode() if raw is not None else None
