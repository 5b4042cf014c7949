"""Typed values in the payload converter (docs/reference/contract.md §15, docs/decisions/typed-values.md):
properties of the round trip, the JSON form each type is sent as, and what the hint refuses."""

from __future__ import annotations

import dataclasses
import enum
import json
import subprocess
import sys
import typing
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.domain.definitions import Signature
from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.serialization import JSON_PLAIN, PayloadConverter
from dex.serialization.typed_values import timedelta_from_text, timedelta_to_text

if typing.TYPE_CHECKING:
    from collections import OrderedDict  # a name the hints below cannot resolve at run time

converter = PayloadConverter()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Line(typing.TypedDict):
    sku: str
    price: Decimal
    when: datetime | None


@attrs.frozen
class Stamp:
    at: time
    on: date
    key: uuid.UUID


@dataclasses.dataclass(frozen=True)
class Bundle:
    stamps: tuple[Stamp, ...]
    span: timedelta
    tags: frozenset[str]
    blob: bytes
    color: Color
    either: int | str | None


# -- strategies ------------------------------------------------------------------------------------

offsets = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)).map(
    lambda d: timezone(timedelta(minutes=d // timedelta(minutes=1)))
)
zones = st.none() | st.just(UTC) | offsets
datetimes = st.datetimes(timezones=zones)
times = st.times(timezones=zones)
decimals = st.decimals(allow_nan=False)  # NaN is never equal to itself; it does round-trip (below)
stamps = st.builds(Stamp, at=times, on=st.dates(), key=st.uuids())
bundles = st.builds(
    Bundle,
    stamps=st.lists(stamps, max_size=3).map(tuple),
    span=st.timedeltas(),
    tags=st.frozensets(st.text(max_size=5), max_size=4),
    blob=st.binary(max_size=16),
    color=st.sampled_from(Color),
    either=st.none() | st.integers() | st.text(max_size=5),
)
lines = st.fixed_dictionaries({"sku": st.text(max_size=5), "price": decimals, "when": st.none() | datetimes})

# (strategy, hint) for every type the contract names
TYPED: list[tuple[st.SearchStrategy[Any], object]] = [
    (datetimes, datetime),
    (st.dates(), date),
    (times, time),
    (st.timedeltas(), timedelta),
    (decimals, Decimal),
    (st.uuids(), uuid.UUID),
    (st.sampled_from(Color), Color),
    (st.sampled_from(Level), Level),
    (st.binary(), bytes),
    (st.tuples(st.integers(), datetimes, st.binary()), tuple[int, datetime, bytes]),
    (st.lists(decimals, max_size=4).map(tuple), tuple[Decimal, ...]),
    (st.sets(st.integers() | st.text(max_size=3), max_size=5), set[int | str]),
    (st.frozensets(st.uuids(), max_size=4), frozenset[uuid.UUID]),
    (st.none() | datetimes, datetime | None),
    (st.none() | st.dates(), typing.Optional[date]),  # noqa: UP045 - the old spelling must work too
    (st.integers() | st.text(), int | str),
    (st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(), bool | int | float | str),
    (st.integers() | datetimes, int | datetime),
    (st.lists(st.timedeltas(), max_size=4), list[timedelta]),
    (st.dictionaries(st.text(max_size=5), decimals, max_size=4), dict[str, Decimal]),
    (lines, Line),
    (stamps, Stamp),
    (bundles, Bundle),
    (st.lists(bundles, max_size=2), list[Bundle]),
]


@pytest.mark.parametrize(("values", "hint"), TYPED, ids=lambda x: getattr(x, "__name__", None) or repr(x))
@given(data=st.data())
def test_every_typed_value_round_trips_as_itself(
    values: st.SearchStrategy[Any], hint: object, data: st.DataObject
) -> None:
    value = data.draw(values)
    payload = converter.encode(value)
    back = converter.decode(payload, hint)
    assert back == value
    assert type(back) is type(value)
    if payload.encoding == JSON_PLAIN:  # the form stays JSON, and encoding it again gives the same bytes
        json.loads(payload.data)
        assert converter.encode(back) == payload


@given(st.lists(st.text(max_size=4) | st.integers() | st.uuids() | st.dates(), max_size=8))
def test_a_set_encodes_to_the_same_bytes_whatever_its_order(items: list[Any]) -> None:
    # a set's order in memory follows the process's hash seed: a replay must still send the same bytes
    forwards, backwards = set(), set()
    for item in items:
        forwards.add(item)
    for item in reversed(items):
        backwards.add(item)
    assert converter.encode(forwards) == converter.encode(backwards) == converter.encode(frozenset(items))


def test_a_set_has_the_same_bytes_in_a_process_with_another_hash_seed() -> None:
    value = {"pear", "apple", "fig", "kiwi", "plum", "lime"}
    script = (
        "from dex.serialization import PayloadConverter; import sys; "
        "sys.stdout.write(PayloadConverter().encode({'pear', 'apple', 'fig', 'kiwi', 'plum', 'lime'}).data.decode())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert outputs == {converter.encode(value).data.decode()}


@given(st.timedeltas())
def test_a_timedelta_text_is_exact(delta: timedelta) -> None:
    assert timedelta_from_text(timedelta_to_text(delta)) == delta


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime(2026, 12, 1, 9, 30, tzinfo=UTC), '"2026-12-01T09:30:00+00:00"'),
        (datetime(2026, 12, 1, 9, 30), '"2026-12-01T09:30:00"'),
        (date(2026, 12, 1), '"2026-12-01"'),
        (time(9, 30, 0, 500), '"09:30:00.000500"'),
        (timedelta(0), '"PT0S"'),
        (timedelta(days=1), '"P1D"'),
        (timedelta(days=1, hours=1, microseconds=500000), '"P1DT3600.5S"'),
        (timedelta(seconds=-1), '"-PT1S"'),
        (Decimal("10.50"), '"10.50"'),
        (Decimal("-1E+3"), '"-1E+3"'),
        (uuid.UUID(int=1), '"00000000-0000-0000-0000-000000000001"'),
        (Color.BLUE, '"blue"'),
        (Level.HIGH, "2"),
        ({3, 1, 2}, "[1,2,3]"),
        (frozenset({"b", "a", "c"}), '["a","b","c"]'),
        ({1, "1"}, '["1",1]'),  # sorted by JSON text: a total order over mixed items
        ([b"\x00\xff"], '["AP8="]'),
        ({"when": date(2026, 1, 1), "n": Decimal(2)}, '{"when":"2026-01-01","n":"2"}'),
    ],
)
def test_the_json_form_of_each_type(value: object, text: str) -> None:
    payload = converter.encode(value)
    assert payload.encoding == JSON_PLAIN
    assert payload.data.decode() == text


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("P2D", timedelta(days=2)),
        ("P1W", timedelta(weeks=1)),
        ("P1Y2DT3S", timedelta(days=367, seconds=3)),  # pydantic's 365-day years
        ("PT0.000001S", timedelta(microseconds=1)),
        ("-P1DT1S", -timedelta(days=1, seconds=1)),
    ],
)
def test_iso_durations_written_elsewhere_are_read(text: str, delta: timedelta) -> None:
    assert converter.decode(Payload(encoding=JSON_PLAIN, data=json.dumps(text).encode()), timedelta) == delta


@pytest.mark.parametrize(
    ("number", "hint", "value"),
    [
        (0.1, Decimal, Decimal("0.1")),  # by its shortest text, not the float's binary value
        (12, Decimal, Decimal(12)),
        (-2.5e-7, Decimal, Decimal("-2.5E-7")),
        (90, timedelta, timedelta(minutes=1, seconds=30)),
        (0.25, timedelta, timedelta(milliseconds=250)),
    ],
)
def test_a_json_number_from_another_language_is_read_where_its_meaning_is_plain(
    number: float, hint: type, value: object
) -> None:
    assert converter.decode(_json(number), hint) == value


def test_a_decimal_nan_round_trips() -> None:
    assert converter.decode(converter.encode(Decimal("NaN")), Decimal).is_nan()


def test_a_union_takes_the_member_the_json_type_names() -> None:
    # untagged: "2026-01-01" is a str for `str | date`, and a date only where no str is wanted
    payload = converter.encode(date(2026, 1, 1))
    assert converter.decode(payload, str | date) == "2026-01-01"
    assert converter.decode(payload, date | int) == date(2026, 1, 1)
    assert converter.decode(converter.encode(5), float | int) == 5
    assert type(converter.decode(converter.encode(5), float | int)) is int
    assert converter.decode(converter.encode(True), int | bool) is True


def _json(value: object) -> Payload:
    return Payload(encoding=JSON_PLAIN, data=json.dumps(value).encode())


@pytest.mark.parametrize(
    ("payload", "hint", "message"),
    [
        (_json("yesterday"), datetime, r"as datetime: invalid value .*Invalid isoformat string: 'yesterday'"),
        (_json(1700000000), datetime, r"as datetime: .*expected datetime as text, got int"),
        (_json("2026-13-01"), date, r"as date: invalid value"),
        (_json("25:00"), time, r"as time: invalid value"),
        (_json("1 hour"), timedelta, r"as timedelta: .*not an ISO 8601 duration"),
        (_json("P"), timedelta, r"as timedelta: .*not an ISO 8601 duration"),
        (_json("P1M"), timedelta, r"as timedelta: .*not an ISO 8601 duration"),  # months vary
        (_json(True), Decimal, r"as Decimal: .*expected Decimal as text or a number, got bool"),
        (_json([1]), timedelta, r"as timedelta: .*expected timedelta as text or a number, got list"),
        (_json("ten"), Decimal, r"as Decimal: .*'ten' is not a decimal number"),
        (_json("not-a-uuid"), uuid.UUID, r"as UUID: invalid value"),
        (_json("green"), Color, r"as Color"),
        (_json("AP8"), bytes, r"as bytes: .*not base64"),
        (_json([1, 1.5]), set[int], r"as set\[int\]: .*@ \$\[1\]"),
        (_json(None), int | str, r"as int \| str: .*fits no member of the union: not int"),
        (_json([1.5]), list[int | datetime], r"fits no member of the union: not int .*; not datetime"),
        (_json({"sku": "x", "price": "1", "when": "soon"}), Line, r"as Line: .*@ \$\.when"),
        (
            _json({"stamps": [], "span": "PT1S", "tags": [], "blob": "", "color": "red", "either": 1.5}),
            Bundle,
            r"as Bundle: .*@ \$\.either",
        ),
    ],
)
def test_a_payload_that_does_not_fit_its_hint_is_refused_naming_the_type(
    payload: Payload, hint: object, message: str
) -> None:
    with pytest.raises(SerializationError, match=message):
        converter.decode(payload, hint)


@given(datetimes)
def test_without_a_hint_a_typed_value_comes_back_as_its_json(moment: datetime) -> None:
    assert converter.decode(converter.encode(moment)) == moment.isoformat()
    assert converter.decode(converter.encode({"at": moment})) == {"at": moment.isoformat()}


def test_register_teaches_a_type_wherever_it_appears() -> None:
    class Celsius(float):
        pass

    class Thermometer(PayloadConverter):
        def __init__(self) -> None:
            super().__init__(max_payload_size=1000)
            self.register(Celsius, encode=lambda c: f"{float(c)}C", decode=lambda text: Celsius(text.rstrip("C")))

    custom = Thermometer()
    payload = custom.encode([Celsius(21.5)])
    assert payload.data == b'["21.5C"]'
    assert custom.decode(payload, list[Celsius]) == [21.5]
    assert type(custom.decode(payload, list[Celsius])[0]) is Celsius
    assert converter.decode(converter.encode([Celsius(1.0)]), list[float]) == [1.0]  # others are untouched
    assert custom.cattrs_converter is not converter.cattrs_converter


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Fatal(BaseException):
    pass


class Token:
    pass


@pytest.mark.parametrize(
    ("exc", "said"),
    [(Unprintable(), "<unprintable Unprintable: __str__ raised RuntimeError>"), (Fatal("x"), "Fatal: x")],
)
def test_what_a_hook_raises_becomes_a_readable_serialization_error(exc: BaseException, said: str) -> None:
    def fail(_: object) -> Any:
        raise exc

    class Failing(PayloadConverter):
        def __init__(self) -> None:
            super().__init__()
            self.register(Token, encode=fail, decode=fail)

    failing = Failing()
    with pytest.raises(SerializationError, match="value of type Token is not serialisable") as encoded:
        failing.encode(Token())
    assert said in str(encoded.value)
    with pytest.raises(SerializationError, match="cannot decode the payload as Token") as decoded:
        failing.decode(converter.encode("t"), Token)
    assert said in str(decoded.value)
    with pytest.raises(SerializationError, match=r"cannot decode the payload as list\[.*Token\]") as nested:
        failing.decode(converter.encode(["t"]), list[Token])
    assert said in str(nested.value) and "@ $[0]" in str(nested.value)  # cattrs' path, as for any error
    assert failing.decode(failing.encode([1]), list[int]) == [1]  # the converter works on


def test_the_core_does_not_import_pydantic() -> None:
    script = "import sys, dex, dex.serialization; sys.exit('pydantic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": ":".join(sys.path)}, check=False)
    assert result.returncode == 0


def _half_typed(when: datetime, amounts: list[Decimal], note: str | None = None) -> OrderedDict[str, int]:
    raise NotImplementedError


def test_a_hint_that_cannot_be_resolved_costs_only_itself() -> None:
    # the return hint names a class imported only for type checkers: the parameters keep theirs
    signature = Signature.of(_half_typed)
    assert signature.parameters == (datetime, list[Decimal], str | None)
    assert signature.returns is None
    assert converter.decode(converter.encode([Decimal("1.5")]), signature.hint_for(1)) == [Decimal("1.5")]
