"""Typed values cross workflows, activities and children as themselves, on every adapter
(docs/reference/contract.md §2 and §15): each is decoded with the receiving function's type hints.

Equality is the check throughout: a datetime that came back as its ISO text, a tuple as a list,
an enum as its value or a set as a list compares unequal to what was sent.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs

import dex


class Tier(enum.Enum):
    BASIC = "basic"
    GOLD = "gold"


class Line(typing.TypedDict):
    sku: str
    price: Decimal
    shipped: date | None


@attrs.frozen
class Parcel:
    parcel_id: uuid.UUID
    weight: Decimal
    label: bytes


@dataclasses.dataclass(frozen=True)
class Everything:
    when: datetime
    day: date
    at: time
    span: timedelta
    amount: Decimal
    key: uuid.UUID
    tier: Tier
    blob: bytes
    pair: tuple[int, str]
    tags: set[str]
    codes: frozenset[int]
    maybe: datetime | None
    either: int | str
    amounts: list[Decimal]
    prices: dict[str, Decimal]
    line: Line
    parcel: Parcel
    naive: datetime


EVERYTHING = Everything(
    when=datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5))),
    day=date(2026, 2, 28),
    at=time(23, 59, 59, 999999),
    span=timedelta(days=-3, seconds=7, microseconds=11),
    amount=Decimal("1234567890.123456789012345678901"),
    key=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    tier=Tier.GOLD,
    blob=b"\x00\xff\x10",
    pair=(7, "seven"),
    tags={"red", "green", "blue"},
    codes=frozenset({3, 1, 2}),
    maybe=None,
    either="either",
    amounts=[Decimal("0.1"), Decimal("-0"), Decimal("1E+3")],
    prices={"a": Decimal("9.99")},
    line={"sku": "sku-1", "price": Decimal("2.50"), "shipped": date(2026, 3, 1)},
    parcel=Parcel(parcel_id=uuid.UUID(int=1), weight=Decimal("0.750"), label=b"label"),
    naive=datetime(1999, 12, 31, 23, 59),
)
# every field at the top level too, in the same order: (name, hint)
TOP_LEVEL = [(f.name, f.type) for f in dataclasses.fields(Everything)]


@dex.activity
def echo_everything(value: Everything) -> Everything:
    if value != EVERYTHING:  # the activity saw the typed values themselves
        raise dex.TerminalError(f"the activity got {value!r}")
    return value


@dex.activity
def spread(value: Everything) -> tuple[Any, ...]:
    return tuple(getattr(value, name) for name, _ in TOP_LEVEL)


@dex.activity
def gather_fields(
    when: datetime,
    day: date,
    at: time,
    span: timedelta,
    amount: Decimal,
    key: uuid.UUID,
    tier: Tier,
    blob: bytes,
    pair: tuple[int, str],
    tags: set[str],
    codes: frozenset[int],
    maybe: datetime | None,
    either: int | str,
    amounts: list[Decimal],
    prices: dict[str, Decimal],
    line: Line,
    parcel: Parcel,
    naive: datetime,
) -> Everything:
    return Everything(
        when,
        day,
        at,
        span,
        amount,
        key,
        tier,
        blob,
        pair,
        tags,
        codes,
        maybe,
        either,
        amounts,
        prices,
        line,
        parcel,
        naive,
    )


@dex.workflow
async def typed_child(ctx: dex.WorkflowContext, value: Everything) -> Everything:
    if value != EVERYTHING:
        raise dex.TerminalError(f"the child got {value!r}")
    return value


@dex.workflow
async def typed_round_trip(ctx: dex.WorkflowContext, value: Everything) -> Everything:
    if value != EVERYTHING:  # the workflow's own argument
        raise dex.TerminalError(f"the workflow got {value!r}")
    echoed = await ctx.activity(echo_everything, value)
    if echoed != EVERYTHING:  # the activity's result, decoded with its return hint
        raise dex.TerminalError(f"the activity returned {echoed!r}")
    # each field as an argument of its own, the result decoded with the return hint
    fields = await ctx.activity(spread, value)
    rebuilt = await ctx.activity(gather_fields, *Everything(*fields).__dict__.values())
    if rebuilt != EVERYTHING:
        raise dex.TerminalError(f"the fields came back as {rebuilt!r}")
    return await ctx.child(typed_child, rebuilt)  # type: ignore[no-any-return]


def test_every_typed_value_round_trips_through_a_workflow_an_activity_and_a_child(make_engine: Any) -> None:
    engine = make_engine([typed_round_trip, typed_child], [echo_everything, spread, gather_fields])
    run_id = engine.start_workflow(typed_round_trip, EVERYTHING)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED, info.failure
    assert info.result == EVERYTHING
    assert engine.wait(run_id, timeout=5) == EVERYTHING


@dex.workflow
async def each_argument(
    ctx: dex.WorkflowContext,
    when: datetime,
    day: date,
    at: time,
    span: timedelta,
    amount: Decimal,
    key: uuid.UUID,
    tier: Tier,
    blob: bytes,
    pair: tuple[int, str],
    tags: set[str],
    codes: frozenset[int],
    maybe: datetime | None,
    either: int | str,
    amounts: list[Decimal],
    prices: dict[str, Decimal],
    line: Line,
    parcel: Parcel,
    naive: datetime,
) -> tuple[datetime, Decimal, set[str], uuid.UUID]:
    got = (
        when,
        day,
        at,
        span,
        amount,
        key,
        tier,
        blob,
        pair,
        tags,
        codes,
        maybe,
        either,
        amounts,
        prices,
        line,
        parcel,
        naive,
    )
    expected = tuple(EVERYTHING.__dict__.values())
    if got != expected:
        raise dex.TerminalError(f"the workflow got {got!r}")
    return when, amount, tags, key


def test_each_type_is_decoded_as_a_workflow_argument_of_its_own(make_engine: Any) -> None:
    engine = make_engine([each_argument], [])
    run_id = engine.start_workflow(each_argument, *EVERYTHING.__dict__.values())
    engine.drain()
    assert engine.wait(run_id, timeout=5) == (EVERYTHING.when, EVERYTHING.amount, EVERYTHING.tags, EVERYTHING.key)


def test_without_a_hint_the_history_holds_plain_json(make_engine: Any) -> None:
    engine = make_engine([typed_round_trip, typed_child], [echo_everything, spread, gather_fields])
    run_id = engine.start_workflow(typed_round_trip, EVERYTHING)
    engine.drain()
    created = engine.history(run_id)[0]
    plain = engine.converter.decode(created.event.input[0])  # what a remote worker or the dashboard reads
    assert plain["when"] == "2026-12-01T09:30:15.123456-05:00"
    assert plain["span"] == "-P2DT86392.999989S"  # minus (2 days, 86392.999989 s)
    assert plain["amount"] == "1234567890.123456789012345678901"
    assert plain["tags"] == ["blue", "green", "red"]  # sorted: the same bytes in every process
    assert plain["blob"] == "AP8Q"
    assert plain["parcel"] == {"parcel_id": str(uuid.UUID(int=1)), "weight": "0.750", "label": "bGFiZWw="}


@dex.workflow
async def gets_stamps(ctx: dex.WorkflowContext) -> list[datetime]:
    stamps: list[datetime] = []

    @ctx.on_event("stamp")
    def on_stamp(moment: datetime) -> None:  # an event handler's hint decodes the event
        stamps.append(moment)

    await ctx.sleep(timedelta(seconds=1))
    return stamps


def test_an_event_handler_gets_its_payload_decoded_with_its_hint(make_engine: Any) -> None:
    engine = make_engine([gets_stamps], [])
    run_id = engine.start_workflow(gets_stamps)
    moment = datetime(2026, 12, 1, tzinfo=UTC)
    engine.send_event(run_id, "stamp", moment)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == [moment]


def test_json_arguments_from_the_api_or_the_cli_are_typed_by_the_hints(make_engine: Any) -> None:
    # POST /v1/runs and `dex runs start --args` hand over parsed JSON, as start_by_name does
    engine = make_engine([typed_round_trip, typed_child], [echo_everything, spread, gather_fields])
    as_json = engine.converter.decode(engine.converter.encode(EVERYTHING))
    run_id = engine.start_by_name("typed_round_trip", [as_json])
    engine.drain()
    assert engine.wait(run_id, timeout=5) == EVERYTHING
