"""Arrays for the batch statements, encoded in PostgreSQL's binary format in one go.

The adapter's one rule for array parameters:

- every array goes in binary, as ``%b::type[]`` (the type named, so that an empty list or one
  of NULLs needs no guessing);
- it is packed here when a statement sends it for each task or result of a round (the flush's
  lease check, run updates, history blocks, inbox consumption and activity tasks; the load of
  a claimed round's inputs): those are the arrays whose element-by-element dumping measured
  half the flusher's CPU (below; psycopg's ``timestamptz`` and ``interval`` dumpers were the
  slowest of all);
- any other array (a statement per child, activity or request, the readers' filters) is a
  Python list, which psycopg's own list dumpers send in binary;
- the one exception is the start's statement through libpq (:mod:`.direct`), which sends
  every value in text form: its one array, the claim's workflow names, is the literal of
  :func:`text_literal` (also the text form of a packed array, for ``%t`` and literals).

``tests/unit/test_array_rule.py`` reads the adapter's SQL and fails on an array parameter sent
another way (``ANY(%s)``, ``%s::text[]``, an unnest argument without its binary cast).

A flush writes a batch of results with ``unnest`` of one array per column: some twenty
arrays of a few dozen elements each. psycopg dumps a list element by element through its
generic dumpers, in Python: about half of the flusher's CPU, held in one stretch of a
millisecond while the application's next start may be waiting for the GIL. Here each array
is packed with one ``struct`` call (or one join) and handed to psycopg as ready bytes: a
``bytes`` subclass per element type, whose dumper (:func:`register`, on each pooled
connection) passes the bytes through with the array type's oid.

The format (``array_recv``): dimensions (1, or 0 when empty), a has-nulls flag, the element
type's oid, then the length and lower bound (1) of the dimension, then each element as its
length (-1 for NULL) and its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

_HEADER = struct.Struct("!iiIii")
_EMPTY = struct.Struct("!iiI")
_NULL = b"\xff\xff\xff\xff"
_TEXT, _INT4, _INT8, _BOOL, _BYTEA, _TIMESTAMPTZ, _INTERVAL = 25, 23, 20, 16, 17, 1184, 1186
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # a binary timestamptz counts microseconds from it
_MICROSECOND = timedelta(microseconds=1)
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"


class TextArray(bytes):
    """A ``text[]`` in binary form (from :func:`texts`)."""


class Int4Array(bytes):
    """An ``integer[]`` in binary form (from :func:`int4s`)."""


class Int8Array(bytes):
    """A ``bigint[]`` in binary form (from :func:`int8s`)."""


class BoolArray(bytes):
    """A ``boolean[]`` in binary form (from :func:`bools`)."""


class ByteaArray(bytes):
    """A ``bytea[]`` in binary form (from :func:`byteas`)."""


class TimestamptzArray(bytes):
    """A ``timestamptz[]`` in binary form (from :func:`timestamptzs`)."""


class IntervalArray(bytes):
    """An ``interval[]`` in binary form (from :func:`intervals`)."""


def _header(count: int, has_null: bool, oid: int) -> bytes:
    return _HEADER.pack(1, has_null, oid, count, 1) if count else _EMPTY.pack(0, 0, oid)


def _variable(values: Sequence[bytes | None], oid: int) -> bytes:
    parts = [_header(len(values), None in values, oid)]
    for value in values:
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(len(value).to_bytes(4, "big"))
            parts.append(value)
    return b"".join(parts)


def texts(values: Sequence[str | None]) -> TextArray:
    return TextArray(_variable([v.encode() if v is not None else None for v in values], _TEXT))


def byteas(values: Sequence[bytes | None]) -> ByteaArray:
    return ByteaArray(_variable(values, _BYTEA))


_FIXED: dict[tuple[str, int], struct.Struct] = {}


def _fixed(values: Sequence[int], code: str, size: int, oid: int) -> bytes:
    count = len(values)
    packer = _FIXED.get((code, count))
    if packer is None:
        if len(_FIXED) >= 512:
            _FIXED.clear()
        packer = _FIXED[(code, count)] = struct.Struct("!" + ("i" + code) * count)
    interleaved = [size] * (2 * count)
    interleaved[1::2] = values
    return _header(count, False, oid) + packer.pack(*interleaved)


def int4s(values: Sequence[int]) -> Int4Array:
    """No NULLs; a value out of range raises ``struct.error``."""
    return Int4Array(_fixed(values, "i", 4, _INT4))


def int8s(values: Sequence[int]) -> Int8Array:
    """No NULLs; a value out of range raises ``struct.error``."""
    return Int8Array(_fixed(values, "q", 8, _INT8))


def timestamptzs(values: Sequence[datetime]) -> TimestamptzArray:
    """Aware datetimes (a naive one raises ``ValueError``: its instant is unknown), no NULLs;
    each as PostgreSQL's eight bytes of microseconds since 2000-01-01 UTC."""
    micros = []
    for value in values:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} cannot be stored: dex stores aware UTC times")
        micros.append((value - _POSTGRES_EPOCH) // _MICROSECOND)
    return TimestamptzArray(_fixed(micros, "q", 8, _TIMESTAMPTZ))


_INTERVAL_ELEMENT = struct.Struct("!iqii")  # length 16, microseconds, days, months


def intervals(values: Sequence[timedelta]) -> IntervalArray:
    """No NULLs; each as psycopg sends a timedelta: its days, and the rest in microseconds."""
    body = b"".join(
        _INTERVAL_ELEMENT.pack(16, value.seconds * 1_000_000 + value.microseconds, value.days, 0) for value in values
    )
    return IntervalArray(_header(len(values), False, _INTERVAL) + body)


def bools(values: Sequence[bool]) -> BoolArray:
    return BoolArray(_header(len(values), False, _BOOL) + b"".join(_TRUE if v else _FALSE for v in values))


def values(packed: bytes) -> list[object]:
    """The elements of an array packed here, as Python values (for a literal, and for tests)."""
    ndim, _has_null, oid = _EMPTY.unpack_from(packed)
    if ndim == 0:
        return []
    _ndim, _flag, _oid, count, _lower = _HEADER.unpack_from(packed)
    read = _READERS[oid]
    out: list[object] = []
    at = _HEADER.size
    for _ in range(count):
        size = int.from_bytes(packed[at : at + 4], "big", signed=True)
        at += 4
        if size < 0:
            out.append(None)
            continue
        out.append(read(packed[at : at + size]))
        at += size
    return out


def _integer(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _timestamptz(data: bytes) -> datetime:
    return _POSTGRES_EPOCH + _integer(data) * _MICROSECOND


def _interval(data: bytes) -> timedelta:
    micros, days, _months = struct.unpack("!qii", data)
    return timedelta(days=days, microseconds=micros)


_READERS: dict[int, Callable[[bytes], object]] = {
    _TIMESTAMPTZ: _timestamptz,
    _INTERVAL: _interval,
    _TEXT: lambda data: data.decode(),
    _INT4: _integer,
    _INT8: _integer,
    _BOOL: lambda data: data == b"\x01",
    _BYTEA: bytes,
}


_TYPE_NAMES = {
    _TEXT: "text",
    _INT4: "integer",
    _INT8: "bigint",
    _BOOL: "boolean",
    _BYTEA: "bytea",
    _TIMESTAMPTZ: "timestamptz",
    _INTERVAL: "interval",
}


def text_literal(items: Iterable[str | None]) -> str:
    """An array's text form (``{"a",NULL}``): every element double-quoted, with ``"`` and
    ``\\`` escaped; None is NULL."""
    quoted = ("NULL" if item is None else '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


def text_form(packed: bytes) -> str:
    """The text form of an array packed here, as PostgreSQL reads it in a literal."""
    oid = _EMPTY.unpack_from(packed)[2]

    def text(item: object) -> str | None:
        if item is None:
            return None
        if oid == _BOOL:
            return "t" if item else "f"
        if isinstance(item, datetime):
            return item.isoformat()
        if isinstance(item, timedelta):
            return f"{item.days} days {item.seconds * 1_000_000 + item.microseconds} microseconds"
        return "\\x" + item.hex() if isinstance(item, bytes) else str(item)

    return text_literal(text(item) for item in values(packed))


class _Packed(Dumper):
    """Passes an array packed here through, with its array type's oid (set per subclass)."""

    format = Format.BINARY
    element_oid = 0

    def dump(self, obj: bytes) -> bytes:
        return obj

    def quote(self, obj: bytes) -> bytes:
        # as a literal (client-side binding, sql.Literal): its text form, cast to its type
        literal = text_form(obj).replace("'", "''")
        return f"'{literal}'::{_TYPE_NAMES[self.element_oid]}[]".encode()


class _PackedAsText(_Packed):
    """The same in text form, for a ``%t`` placeholder and for literals."""

    format = Format.TEXT

    def dump(self, obj: bytes) -> bytes:
        return text_form(obj).encode()


def _dumpers(array_oid: int, element_oid: int) -> tuple[type[Dumper], type[Dumper]]:
    """The text and binary dumper of one array type."""
    fields = {"oid": array_oid, "element_oid": element_oid}
    return type("PackedText", (_PackedAsText,), fields), type("Packed", (_Packed,), fields)


_DUMPERS: list[tuple[type[bytes], tuple[type[Dumper], type[Dumper]]]] = [
    (TextArray, _dumpers(1009, _TEXT)),
    (Int4Array, _dumpers(1007, _INT4)),
    (Int8Array, _dumpers(1016, _INT8)),
    (BoolArray, _dumpers(1000, _BOOL)),
    (ByteaArray, _dumpers(1001, _BYTEA)),
    (TimestamptzArray, _dumpers(1185, _TIMESTAMPTZ)),
    (IntervalArray, _dumpers(1187, _INTERVAL)),
]


def register(conn: psycopg.Connection) -> None:
    """Let ``conn`` send these arrays (the pool does it for each connection it opens); the
    binary dumper is registered last, so ``%s`` picks it as well as ``%b``."""
    for cls, dumpers in _DUMPERS:
        for dumper in dumpers:
            conn.adapters.register_dumper(cls, dumper)
