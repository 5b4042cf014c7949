"""Pydantic models cross workflows and activities as themselves, on every adapter
(docs/reference/contract.md §15; ``pip install "dex-engine[pydantic]"``, which the test extra installs)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

import dex

pydantic = pytest.importorskip(
    "pydantic", reason='pydantic is not installed: pip install "dex-engine[pydantic]" (the test extra has it)'
)


class Address(pydantic.BaseModel):
    street: str
    city: str


class Customer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True)

    customer_id: uuid.UUID
    name: str = pydantic.Field(alias="fullName")
    since: datetime
    credit: Decimal
    tags: frozenset[str] = frozenset()
    address: Address | None = None
    avatar: bytes = b""


class Base64Blob(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    data: bytes


@dataclasses.dataclass(frozen=True)
class Welcome:
    customer: Customer
    sent: datetime
    delay: timedelta


CUSTOMER = Customer(
    customer_id=uuid.UUID(int=7),
    fullName="Zoë ☃",
    since=datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC),
    credit=Decimal("100.25"),
    tags=frozenset({"vip", "early"}),
    address=Address(street="1 Main St", city="Springfield"),
    avatar=b"png",
)


@dex.activity
def welcome(customer: Customer) -> Welcome:
    if not isinstance(customer, Customer) or customer != CUSTOMER:
        raise dex.TerminalError(f"the activity got {customer!r}")
    return Welcome(customer=customer, sent=customer.since + timedelta(days=1), delay=timedelta(hours=2))


@dex.activity
def blobs(blob: Base64Blob) -> list[Base64Blob]:
    return [blob, Base64Blob(data=blob.data[::-1])]


@dex.workflow
async def onboard(ctx: dex.WorkflowContext, customer: Customer, blob: Base64Blob) -> tuple[Welcome, list[Base64Blob]]:
    if customer != CUSTOMER:
        raise dex.TerminalError(f"the workflow got {customer!r}")
    return await ctx.activity(welcome, customer), await ctx.activity(blobs, blob)


def test_pydantic_models_round_trip_through_a_workflow_and_an_activity(make_engine: Any) -> None:
    engine = make_engine([onboard], [welcome, blobs])
    blob = Base64Blob(data=b"\x00\xff not utf-8 \x80")
    run_id = engine.start_workflow(onboard, CUSTOMER, blob)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED, info.failure
    assert info.result == (
        Welcome(customer=CUSTOMER, sent=datetime(2020, 1, 3, 3, 4, 5, tzinfo=UTC), delay=timedelta(hours=2)),
        [blob, Base64Blob(data=blob.data[::-1])],
    )
    # in the history, pydantic's own JSON form: its aliases and its base64 setting
    plain = engine.converter.decode(engine.history(run_id)[0].event.input[0])
    assert plain["fullName"] == "Zoë ☃" and plain["credit"] == "100.25"
    assert engine.converter.decode(engine.history(run_id)[0].event.input[1]) == {"data": "AP8gbm90IHV0Zi04IIA="}


def test_a_payload_the_model_refuses_fails_the_run_with_the_validation_error(make_engine: Any) -> None:
    engine = make_engine([onboard], [welcome, blobs])
    run_id = engine.start_workflow(onboard, CUSTOMER, {"data": "not base64!"})
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "SerializationError"
    assert info.failure.message.startswith("argument 1: cannot decode the payload as Base64Blob")
    run_id = engine.start_workflow(onboard, {"customer_id": "not a uuid", "fullName": "x"}, {"data": ""})
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "SerializationError"
    assert info.failure.message.startswith("argument 0: cannot decode the payload as Customer")
    assert "customer_id" in info.failure.message  # pydantic's own words say which field
    run_id = engine.start_workflow(onboard, CUSTOMER, Base64Blob(data=b"ok"))  # a healthy run after it
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED


@dex.workflow
async def returns_customer(ctx: dex.WorkflowContext, customer: Customer) -> Customer:
    return customer


def test_a_model_with_a_lone_surrogate_is_refused_at_the_call(make_engine: Any) -> None:
    engine = make_engine([onboard, returns_customer], [welcome, blobs])
    poisoned = CUSTOMER.model_copy(update={"name": "bad\ud800"})
    with pytest.raises(dex.SerializationError, match=r"argument 0: .*Customer.*not valid Unicode"):
        engine.start_workflow(onboard, poisoned, Base64Blob(data=b""))
    assert engine.list_runs() == []
    nul = CUSTOMER.model_copy(update={"name": "nul\x00inside"})  # a NUL is an ordinary character in JSON
    run_id = engine.start_workflow(returns_customer, nul)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == nul  # it arrived whole, NUL included
    run_id = engine.start_workflow(onboard, CUSTOMER, Base64Blob(data=b""))
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
