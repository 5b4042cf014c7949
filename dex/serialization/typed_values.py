"""The JSON form of the standard library's value types, and of unions, for the payload converter.

A typed value is sent as plain JSON, without a tag naming its type (docs/decisions/typed-values.md):
the receiver's type hint says what to make of it. So a remote worker, the dashboard and a reader
of the history see ordinary JSON, and a value read without a hint comes back as that JSON.

==========================  ==============================================  ========================
type                        JSON form                                       example
==========================  ==============================================  ========================
``datetime``                ISO 8601 text, with its UTC offset if aware     ``"2026-12-01T09:30:00+00:00"``
``date``, ``time``          ISO 8601 text                                   ``"2026-12-01"``, ``"09:30:00"``
``timedelta``               ISO 8601 duration, in days and seconds          ``"P1DT3600.5S"``, ``"-PT1S"``
                            (a JSON number is read as seconds)
``Decimal``                 its text (every digit kept; a JSON number is    ``"10.50"``
                            read by its shortest text: 0.1 is ``0.1``)
``UUID``                    its canonical text                              ``"12345678-1234-..."``
``Enum``                    its value                                       ``"gold"``
``bytes`` inside a value    standard base64 text                            ``"AAH/"``
``set``, ``frozenset``      a list, sorted by each item's JSON text         ``[1, 2, 3]``
``tuple``                   a list                                          ``[1, "a"]``
==========================  ==============================================  ========================

Sets are sorted because their order in memory depends on the process's hash seed: the same set
must encode to the same bytes in the run that sent it and in every replay.

A union a hint names (``int | str``, ``datetime | None``) takes the member whose JSON type the
value has exactly (a JSON string for ``str``), else the first member, left to right, that
accepts it. Unions of attrs classes or dataclasses alone keep cattrs' own choice (by the
fields only one of them has).
"""

from __future__ import annotations

import base64
import binascii
import collections.abc
import dataclasses
import json
import re
import types
import typing
import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import attrs
import cattrs


def register_typed_values(converter: cattrs.Converter) -> None:
    """Teach ``converter`` the JSON form of each type in the table above, both ways."""
    for cls, unstructure, structure, from_number in _TEXT_FORMS:
        converter.register_unstructure_hook(cls, unstructure)
        converter.register_structure_hook(cls, _from_text(structure, from_number, cls.__name__))
    for binary in (bytes, bytearray):
        converter.register_unstructure_hook(binary, _bytes_to_text)
        converter.register_structure_hook(binary, _bytes_from_text)
    converter.register_unstructure_hook_func(_is_set_hint, lambda items: _sorted_set(converter, items))
    converter.register_structure_hook_factory(_is_mixed_union, lambda hint: _union_structure(converter, hint))


# -- text forms ---------------------------------------------------------------------------------

_DURATION = re.compile(
    r"(?P<sign>-)?P(?:(?P<years>\d+)Y)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)(?:\.(?P<fraction>\d{1,6}))?S)?)?"
)


def timedelta_to_text(delta: timedelta) -> str:
    """``delta`` as an ISO 8601 duration in whole days and seconds (``P1DT0.5S``; ``PT0S`` for
    zero), exact to the microsecond: a day is 86,400 seconds, as in Python."""
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    text = f"{sign}P"
    if delta.days:
        text += f"{delta.days}D"
    if delta.seconds or delta.microseconds or not delta.days:
        fraction = f".{delta.microseconds:06d}".rstrip("0") if delta.microseconds else ""
        text += f"T{delta.seconds}{fraction}S"
    return text


def timedelta_from_text(text: str) -> timedelta:
    """The duration ``text`` names: what :func:`timedelta_to_text` writes, or an ISO 8601
    duration in weeks, days, hours, minutes and seconds (``PT1H30M``), or in years of 365 days
    as pydantic writes them (``P1Y2DT3S``); never months, whose length varies. ValueError otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None or text.endswith(("P", "T")):
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as 'P1DT2.5S'")
    parts = {
        name: int(value) for name, value in match.groupdict().items() if value and name not in ("sign", "fraction")
    }
    fraction = match.group("fraction") or ""
    delta = timedelta(
        days=parts.get("years", 0) * 365 + parts.get("days", 0),
        weeks=parts.get("weeks", 0),
        hours=parts.get("hours", 0),
        minutes=parts.get("minutes", 0),
        seconds=parts.get("seconds", 0),
        microseconds=int(fraction.ljust(6, "0")) if fraction else 0,
    )
    return -delta if match.group("sign") else delta


def _decimal_from_text(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a decimal number") from None


def _decimal_from_number(number: int | float) -> Decimal:
    # a float by its shortest text (0.1 is "0.1", what its writer meant), as pydantic reads it
    return Decimal(number) if isinstance(number, int) else _decimal_from_text(repr(number))


def _timedelta_from_seconds(seconds: int | float) -> timedelta:
    return timedelta(seconds=seconds)


_Parse = typing.Callable[[Any], Any]
# each type: its text form, the parser of that text, and the parser of a JSON number where a
# number has one obvious meaning (seconds; a decimal's digits) that workers in other languages,
# which have no such type, may well send
_TEXT_FORMS: tuple[tuple[type, typing.Callable[[Any], str], _Parse, _Parse | None], ...] = (
    (datetime, datetime.isoformat, datetime.fromisoformat, None),
    (date, date.isoformat, date.fromisoformat, None),
    (time, time.isoformat, time.fromisoformat, None),
    (timedelta, timedelta_to_text, timedelta_from_text, _timedelta_from_seconds),
    (Decimal, str, _decimal_from_text, _decimal_from_number),
    (uuid.UUID, str, uuid.UUID, None),
)


def _from_text(parse: _Parse, parse_number: _Parse | None, name: str) -> typing.Callable[[Any, type], Any]:
    def structure(value: Any, _cls: type) -> Any:
        if isinstance(value, str):
            return parse(value)
        if parse_number is not None and type(value) in (int, float):  # a bool is no number here
            return parse_number(value)
        raise TypeError(f"expected {name} as text{' or a number' if parse_number else ''}, got {type(value).__name__}")

    return structure


def _bytes_to_text(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _bytes_from_text(value: Any, cls: type) -> bytes | bytearray:
    if not isinstance(value, str):
        raise TypeError(f"expected bytes as base64 text, got {type(value).__name__}")
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise ValueError("expected bytes as base64 text, got text that is not base64") from None
    return bytearray(data) if issubclass(cls, bytearray) else data


# -- sets ------------------------------------------------------------------------------------------

_SET_ORIGINS = (set, frozenset, collections.abc.Set, collections.abc.MutableSet)


def _is_set_hint(hint: object) -> bool:
    origin = typing.get_origin(hint) or hint
    return isinstance(origin, type) and issubclass(origin, _SET_ORIGINS)


def _sorted_set(converter: cattrs.Converter, items: collections.abc.Set[Any]) -> list[Any]:
    unstructured = [converter.unstructure(item) for item in items]
    # JSON text is a total order over every JSON value (1 and "1" too); NaN has one text
    return sorted(unstructured, key=lambda item: json.dumps(item, sort_keys=True, default=repr))


# -- unions ----------------------------------------------------------------------------------------

_EXACT_JSON: dict[object, tuple[type, ...]] = {str: (str,), int: (int,), bool: (bool,), float: (float,)}


def _union_members(hint: object) -> tuple[object, ...] | None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return None


def _is_class(member: object) -> bool:
    return isinstance(member, type) and (attrs.has(member) or dataclasses.is_dataclass(member))


def _is_mixed_union(hint: object) -> bool:
    """A union cattrs cannot take as it is: more than one member that is not None, not all of
    them attrs classes or dataclasses."""
    members = _union_members(hint)
    if members is None:
        return False
    others = [member for member in members if member is not type(None)]
    return len(others) > 1 and not all(_is_class(member) for member in others)


def _union_structure(converter: cattrs.Converter, hint: object) -> typing.Callable[[Any, Any], Any]:
    members = _union_members(hint) or ()

    def structure(value: Any, _hint: Any) -> Any:
        if value is None and type(None) in members:
            return None
        for member in members:  # the member the JSON type names exactly: "2026-01-01" for str
            exact = _EXACT_JSON.get(member)
            if exact is not None and type(value) in exact:
                return value
        problems = []
        for member in members:
            if member is type(None):
                continue
            try:
                return converter.structure(value, typing.cast(Any, member))
            except Exception as exc:  # noqa: BLE001 - the next member may take it; all are reported
                problems.append(f"not {_name(member)} ({_first_line(exc)})")
        raise ValueError(f"the value fits no member of the union: {'; '.join(problems)}")

    return structure


def _name(hint: object) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint).replace("typing.", "")


def _first_line(exc: BaseException) -> str:
    try:
        if isinstance(exc, cattrs.BaseValidationError):
            return "; ".join(cattrs.transform_error(exc))
        text = str(exc)
    except Exception:  # noqa: BLE001 - a message that cannot be printed: its type says enough
        return type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__
