"""A payload's JSON form (docs/reference/contract.md §13): json/plain as is, anything else a clear error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.serialization.json_form import NoJsonFormError, json_value, json_values, payload_of_json
from dex.serialization.payloads import PayloadConverter

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
).filter(lambda v: _valid_unicode(v))


def _valid_unicode(value: Any) -> bool:
    try:
        payload_of_json(value)
    except SerializationError:
        return False
    return True


@given(JSON)
def test_a_json_value_crosses_both_ways_unchanged(value: Any) -> None:
    assert json_value(payload_of_json(value)) == value
    # and reads as the converter's own payload of it
    assert PayloadConverter().decode(payload_of_json(value)) == value


def test_the_converters_payloads_have_their_json_form() -> None:
    converter = PayloadConverter()
    assert json_values(
        (converter.encode({"a": [1, 2.5, None]}), converter.encode("x\x00y"), converter.encode(2**70))
    ) == [
        {"a": [1, 2.5, None]},
        "x\x00y",
        2**70,
    ]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (Payload(encoding="binary/plain", data=b"\x00\x01"), "binary/plain payload has no JSON form"),
        (Payload(encoding="binary/protobuf", data=b"", message_type="x.Y"), r"binary/protobuf \(x.Y\)"),
        (Payload(encoding="json/plain", data=b"NaN"), "not strict JSON"),
        (Payload(encoding="json/plain", data=b"[Infinity]"), "not strict JSON"),
        (Payload(encoding="json/plain", data=b"\xff"), "not strict JSON"),
        (Payload(encoding="json/plain", data=b"[" * 50_000), "nested too deeply"),
    ],
)
def test_a_payload_with_no_json_form_says_so(payload: Payload, match: str) -> None:
    with pytest.raises(NoJsonFormError, match=match):
        json_value(payload)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("\ud800", "not valid Unicode"),
        ({"k": ["\udfff"]}, "not valid Unicode"),
        (float("nan"), "not JSON"),
        (float("inf"), "not JSON"),
        (b"bytes", "not JSON"),
        ({1, 2}, "not JSON"),
    ],
)
def test_a_value_that_is_not_json_is_refused(value: Any, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        payload_of_json(value)


def test_a_value_larger_than_the_limit_is_refused() -> None:
    assert payload_of_json("x" * 8, max_size=10).data == b'"xxxxxxxx"'
    with pytest.raises(SerializationError, match="exceeds the limit of 10 bytes"):
        payload_of_json("x" * 9, max_size=10)
