"""The payload converter (docs/reference/contract.md §2): what can be sent, how it comes back, and what is refused."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import typing
from datetime import UTC, datetime
from decimal import Decimal

import attrs
import pytest
from google.protobuf import struct_pb2, timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from dex.domain import definitions
from dex.domain.errors import DexError, SerializationError
from dex.domain.values import Payload
from dex.serialization import (
    BINARY_PLAIN,
    BINARY_PROTOBUF,
    JSON_PLAIN,
    PayloadConverter,
)
from dex.v1 import payload_pb2


@attrs.frozen
class Item:
    sku: str
    quantity: int
    price: float = 0.0


class Tier(enum.Enum):
    BASIC = "basic"
    GOLD = "gold"


@attrs.frozen(kw_only=True)
class Order:
    order_id: str
    items: tuple[Item, ...]
    tier: Tier = Tier.BASIC
    note: str | None = None
    extra: dict[str, list[int]] = attrs.field(factory=dict)


@dataclasses.dataclass
class Receipt:
    order: Order
    lines: dict[str, Item]
    total: float


@dataclasses.dataclass
class Tagged:
    tags: typing.Any


converter = PayloadConverter()

# --- strategies ---------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
items = st.builds(Item, sku=st.text(), quantity=st.integers(), price=st.floats(allow_nan=False))
orders = st.builds(
    Order,
    order_id=st.text(),
    items=st.lists(items, max_size=3).map(tuple),
    tier=st.sampled_from(Tier),
    note=st.none() | st.text(),
    extra=st.dictionaries(st.text(max_size=5), st.lists(st.integers(), max_size=3), max_size=3),
)
receipts = st.builds(
    Receipt,
    order=orders,
    lines=st.dictionaries(st.text(max_size=5), items, max_size=3),
    total=st.floats(allow_nan=False),
)


def test_it_implements_the_domain_protocol() -> None:
    port: definitions.PayloadConverter = converter
    assert port.decode(port.encode({"a": 1})) == {"a": 1}


# --- round trips --------------------------------------------------------------------------


@given(json_values)
def test_json_values_round_trip(value: object) -> None:
    payload = converter.encode(value)
    assert payload.encoding == JSON_PLAIN and payload.message_type == ""
    assert converter.decode(payload) == value
    assert converter.decode(payload, typing.Any) == value
    assert converter.decode(payload, object) == value


def test_json_is_compact_utf8_without_ascii_escapes() -> None:
    payload = converter.encode({"name": "Zoë ☃", "n": [1, 2.5, None, True]})
    assert payload.data == '{"name":"Zoë ☃","n":[1,2.5,null,true]}'.encode()


def test_tuples_are_sent_as_lists_and_restored_by_the_hint() -> None:
    payload = converter.encode((1, (2, 3)))
    assert converter.decode(payload) == [1, [2, 3]]
    assert converter.decode(payload, tuple[int, tuple[int, int]]) == (1, (2, 3))


def test_infinity_survives() -> None:
    assert converter.decode(converter.encode([math.inf, -math.inf])) == [math.inf, -math.inf]


@given(st.binary())
def test_bytes_round_trip(value: bytes) -> None:
    payload = converter.encode(value)
    assert payload == Payload(encoding=BINARY_PLAIN, data=value)
    assert converter.decode(payload) == value
    assert converter.decode(payload, bytes) == value


@given(st.dictionaries(st.text(max_size=8), st.floats(allow_nan=False) | st.text() | st.booleans(), max_size=5))
def test_protobuf_message_round_trips_with_and_without_a_hint(fields: dict[str, typing.Any]) -> None:
    message = struct_pb2.Struct()
    message.update(fields)
    payload = converter.encode(message)
    assert payload.encoding == BINARY_PROTOBUF
    assert payload.message_type == "google.protobuf.Struct"
    assert converter.decode(payload, struct_pb2.Struct) == message
    assert converter.decode(payload, struct_pb2.Struct | None) == message
    unhinted = converter.decode(payload)
    assert isinstance(unhinted, struct_pb2.Struct) and unhinted == message


def test_dex_proto_message_is_found_by_its_full_name() -> None:
    message = payload_pb2.Payload(encoding="x", data=b"\x00\x01", message_type="t")
    payload = converter.encode(message)
    assert payload.message_type == "dex.v1.Payload"
    assert converter.decode(payload) == message


@given(orders)
def test_attrs_class_round_trips_with_its_hint(order: Order) -> None:
    payload = converter.encode(order)
    assert payload.encoding == JSON_PLAIN
    assert converter.decode(payload, Order) == order
    assert converter.decode(payload, Order | None) == order


@given(receipts)
def test_dataclass_with_nested_classes_round_trips(receipt: Receipt) -> None:
    assert converter.decode(converter.encode(receipt), Receipt) == receipt


@given(st.lists(orders, max_size=3))
def test_list_of_classes_round_trips_with_a_generic_hint(values: list[Order]) -> None:
    decoded = converter.decode(converter.encode(values), list[Order])
    assert decoded == values and all(isinstance(v, Order) for v in decoded)


def test_dict_of_classes_round_trips() -> None:
    value = {"a": Item("x", 1), "b": Item("y", 2, 9.5)}
    assert converter.decode(converter.encode(value), dict[str, Item]) == value


def test_without_a_hint_classes_come_back_as_plain_json() -> None:
    order = Order(order_id="o1", items=(Item("x", 2),), tier=Tier.GOLD)
    assert converter.decode(converter.encode(order)) == {
        "order_id": "o1",
        "items": [{"sku": "x", "quantity": 2, "price": 0.0}],
        "tier": "gold",
        "note": None,
        "extra": {},
    }


def test_primitive_hints_and_optional() -> None:
    assert converter.decode(converter.encode(5), int) == 5
    assert converter.decode(converter.encode(5), float) == 5.0
    assert converter.decode(converter.encode(None), int | None) is None
    assert converter.decode(converter.encode("s"), typing.Optional[str]) == "s"  # noqa: UP045 - the old spelling must work too
    assert converter.decode(converter.encode("gold"), Tier) is Tier.GOLD


def test_a_bytearray_is_sent_as_bytes() -> None:
    converter = PayloadConverter()
    payload = converter.encode(bytearray(b"\x00\xff"))
    assert payload == converter.encode(b"\x00\xff")
    assert converter.decode(payload) == b"\x00\xff"
    restored = converter.decode(payload, bytearray)
    assert restored == bytearray(b"\x00\xff") and type(restored) is bytearray


@given(st.integers() | st.text())
def test_ints_and_strings_take_a_shortcut_to_the_same_bytes(value: int | str) -> None:
    # the converter writes these without cattrs: the bytes must be what json.dumps writes
    payload = converter.encode(value)
    assert payload.data == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    back = converter.decode(payload, type(value))
    assert back == value and type(back) is type(value)


def test_plain_hints_still_refuse_another_json_type_by_name() -> None:
    for value, hint, expected in [(True, int, "an int"), (1.5, int, "an int"), (3, str, "a str"), (1, bool, "a bool")]:
        with pytest.raises(SerializationError, match=f"cannot decode the payload as {hint.__name__}: .*{expected}"):
            converter.decode(converter.encode(value), hint)
    assert type(converter.decode(converter.encode(3), float)) is float


def test_unresolved_hints_decode_without_structuring() -> None:
    payload = converter.encode({"a": [1]})
    assert converter.decode(payload, "Order") == {"a": [1]}
    assert converter.decode(payload, typing.TypeVar("T")) == {"a": [1]}


# --- refused values -----------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Opaque(), r"value of type Opaque is not serialisable"),
        ([1, 2, {"x": [Opaque()]}], r"value of type Opaque at \[2\]\['x'\]\[0\] is not serialisable"),
        ({"when": datetime(2024, 1, 1, tzinfo=UTC), "what": Opaque()}, r"value of type Opaque at \['what'\]"),
        (Tagged(tags=[Decimal(1), Opaque()]), r"value of type Opaque at \['tags'\]\[1\] is not serialisable"),
        (Tagged(tags=range(3)), r"value of type range at \['tags'\] is not serialisable"),
        ({1: "a"}, r"value of type dict is not serialisable: its key 1 is of type int"),
        ([{"ok": {1: 0}}], r"value of type dict at \[0\]\['ok'\] is not serialisable: its key 1 is of type int"),
        ({(1, 2): 0}, r"value of type dict is not serialisable: its key \(1, 2\) is of type tuple"),
        ({"k": [{(1,): 0}]}, r"dict at \['k'\]\[0\] is not serialisable: its key \(1,\) is of type tuple"),
        (
            {"s": struct_pb2.Struct()},
            r"value of type Struct at \['s'\] .*protobuf messages can be sent only as a whole",
        ),
        ([struct_pb2.Struct()], r"value of type Struct at \[0\] .*protobuf messages can be sent only as a whole"),
        (Item("x", {1}), r"value of type set at \['quantity'\] is not serialisable"),  # type: ignore[arg-type]
        ("\ud800", r"not valid Unicode"),
    ],
)
def test_unserialisable_values_raise_naming_type_and_place(value: object, message: str) -> None:
    with pytest.raises(SerializationError, match=message) as info:
        converter.encode(value)
    assert isinstance(info.value, DexError)


def test_self_referencing_value_is_refused() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(SerializationError, match="nested too deeply or contains itself"):
        converter.encode(loop)


# --- refused payloads ---------------------------------------------------------------------


def _json(value: object) -> Payload:
    return Payload(encoding=JSON_PLAIN, data=json.dumps(value).encode())


@pytest.mark.parametrize(
    ("payload", "hint", "message"),
    [
        (_json(1.5), int, r"cannot decode the payload as int: .*expected an int, got float"),
        (_json(True), int, r"cannot decode the payload as int: .*got bool"),
        (_json(5), str, r"cannot decode the payload as str"),
        (_json(["a"]), list[int], r"cannot decode the payload as list\[int\]: .*@ \$\[0\]"),
        (_json({"sku": "x"}), Item, r"cannot decode the payload as Item: .*quantity"),
        (_json({"sku": "x", "quantity": "many"}), Item, r"as Item: .*expected int @ \$\.quantity"),
        (_json("platinum"), Tier, r"cannot decode the payload as Tier"),
        (_json([1]), Opaque, r"cannot decode the payload as Opaque"),
        (_json({}), struct_pb2.Struct, r"cannot decode the payload as Struct"),
        (_json("not base64!"), bytes, r"cannot decode the payload as bytes: .*not base64"),
        (_json(104), bytes, r"cannot decode the payload as bytes: .*expected bytes as base64 text, got int"),
        (Payload(encoding=BINARY_PLAIN, data=b"x"), str, r"as str: it holds a value of type bytes"),
        (Payload(encoding=JSON_PLAIN, data=b"{not json"), None, r"payload is not valid UTF-8 JSON"),
        (Payload(encoding=JSON_PLAIN, data=b"\xff"), None, r"payload is not valid UTF-8 JSON"),
        (Payload(encoding="pickle", data=b"x"), None, r"unknown payload encoding 'pickle'"),
        (
            Payload(encoding=BINARY_PROTOBUF, data=b"", message_type="no.such.Message"),
            None,
            r"unknown protobuf message type 'no.such.Message'",
        ),
        (
            Payload(encoding=BINARY_PROTOBUF, data=b"\xff\xff", message_type="google.protobuf.Struct"),
            None,
            r"cannot decode the payload as google.protobuf.Struct",
        ),
        (
            Payload(encoding=BINARY_PROTOBUF, data=b"", message_type="google.protobuf.Struct"),
            timestamp_pb2.Timestamp,
            r"holds a google.protobuf.Struct message, not the google.protobuf.Timestamp",
        ),
        (
            Payload(encoding=BINARY_PROTOBUF, data=b"", message_type="google.protobuf.Struct"),
            Item,
            r"as Item: it holds a value of type Struct",
        ),
    ],
)
def test_payloads_that_do_not_fit_the_hint_raise(payload: Payload, hint: object, message: str) -> None:
    with pytest.raises(SerializationError, match=message):
        converter.decode(payload, hint)


# --- size limit ---------------------------------------------------------------------------


def test_default_limit_is_two_mebibytes() -> None:
    assert converter.max_payload_size == 2 * 1024 * 1024
    assert len(converter.encode(b"x" * (2 * 1024 * 1024)).data) == 2 * 1024 * 1024
    with pytest.raises(SerializationError, match="payload of 2097153 bytes exceeds the limit of 2097152 bytes"):
        converter.encode(b"x" * (2 * 1024 * 1024 + 1))


@pytest.mark.parametrize(
    ("value", "size"),
    [("a" * 9, 11), (b"b" * 11, 11), ([1, 2, 3, 4, 5], 11), (struct_pb2.Value(string_value="abcdefghi"), 11)],
)
def test_encoding_larger_than_the_limit_is_refused(value: object, size: int) -> None:
    small = PayloadConverter(max_payload_size=10)
    with pytest.raises(SerializationError, match=f"payload of {size} bytes exceeds the limit of 10 bytes"):
        small.encode(value)
    assert PayloadConverter(max_payload_size=size).encode(value).data  # exactly at the limit is fine


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_payload_size"):
        PayloadConverter(max_payload_size=0)


def test_object_inside_a_generic_hint_takes_any_json_value() -> None:
    converter = PayloadConverter()
    value = {"a": 1, "b": [1, "x"], "c": None}
    assert converter.decode(converter.encode(value), dict[str, object]) == value
    assert converter.decode(converter.encode([1, "two"]), list[object]) == [1, "two"]
