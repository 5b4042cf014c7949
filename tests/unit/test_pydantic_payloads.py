"""Pydantic models in the payload converter: a property of the round trip, and the form they take
(``pip install "dex-engine[pydantic]"``, which the test extra installs)."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.domain.errors import SerializationError
from dex.serialization import PayloadConverter

pydantic = pytest.importorskip(
    "pydantic", reason='pydantic is not installed: pip install "dex-engine[pydantic]" (the test extra has it)'
)

converter = PayloadConverter()


class Item(pydantic.BaseModel):
    sku: str
    price: Decimal
    added: datetime


class Basket(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True)

    basket_id: uuid.UUID
    owner: str = pydantic.Field(alias="ownerName")
    items: tuple[Item, ...] = ()
    due: date | None = None
    hold: timedelta = timedelta(0)
    codes: frozenset[int] = frozenset()


items = st.builds(
    Item,
    sku=st.text(max_size=5),
    price=st.decimals(allow_nan=False, allow_infinity=False),
    # fixed offsets: an aware datetime in a fold or gap of a zone never equals one in another zone
    added=st.datetimes(
        timezones=st.none()
        | st.timedeltas(min_value=-timedelta(hours=12), max_value=timedelta(hours=12)).map(
            lambda d: timezone(timedelta(minutes=d // timedelta(minutes=1)))
        )
    ),
)
baskets = st.builds(
    Basket,
    basket_id=st.uuids(),
    ownerName=st.text(max_size=5),
    items=st.lists(items, max_size=3).map(tuple),
    due=st.none() | st.dates(),
    hold=st.timedeltas(min_value=timedelta(days=-999), max_value=timedelta(days=999)),
    codes=st.frozensets(st.integers(), max_size=3),
)


@given(baskets)
def test_a_model_round_trips_as_itself_alone_and_in_containers(basket: Basket) -> None:
    assert converter.decode(converter.encode(basket), Basket) == basket
    assert converter.decode(converter.encode([basket]), list[Basket]) == [basket]
    assert converter.decode(converter.encode({"b": basket}), dict[str, Basket | None]) == {"b": basket}


def test_a_model_is_sent_in_its_own_json_form_with_its_aliases() -> None:
    basket = Basket(basket_id=uuid.UUID(int=1), ownerName="Zoë", hold=timedelta(minutes=90))
    plain = converter.decode(converter.encode(basket))
    assert plain["ownerName"] == "Zoë" and plain["basket_id"] == str(uuid.UUID(int=1))
    assert plain["hold"] == basket.model_dump(mode="json")["hold"]


def test_a_duration_pydantic_wrote_is_read_by_a_timedelta_hint() -> None:
    span = timedelta(days=-667, seconds=898, microseconds=869)
    written = Basket(basket_id=uuid.UUID(int=1), ownerName="x", hold=span).model_dump(mode="json")["hold"]
    assert "Y" in written  # pydantic counts 365-day years
    assert converter.decode(converter.encode(written), timedelta) == span


def test_a_validation_error_names_the_model_and_the_field() -> None:
    with pytest.raises(SerializationError, match=r"cannot decode the payload as Basket: .*basket_id"):
        converter.decode(converter.encode({"basket_id": "nope", "ownerName": "x"}), Basket)


class Stop(BaseException):
    pass


class Touchy(pydantic.BaseModel):
    value: int

    @pydantic.field_validator("value")
    @classmethod
    def refuse_seven(cls, value: int) -> int:
        if value == 7:
            raise Stop("a validator raised a BaseException")
        return value


def test_a_validator_raising_a_base_exception_is_that_payload_s_refusal() -> None:
    with pytest.raises(
        SerializationError, match=r"as list\[.*Touchy\]: invalid value \(Stop: a validator raised"
    ) as info:
        converter.decode(converter.encode([{"value": 7}]), list[Touchy])
    assert "@ $[0]" in str(info.value)  # cattrs' path to it, as for an ordinary error
    assert converter.decode(converter.encode([{"value": 1}]), list[Touchy]) == [Touchy(value=1)]
