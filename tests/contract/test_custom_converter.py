"""A ``dex.PayloadConverter`` subclass for one's own types, on every adapter (docs/reference/contract.md §15),
and what its hooks may do wrong: each fault is the one call's or the one run's, and a healthy run
afterwards completes."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

import dex


class Money:
    """Not a dataclass, not attrs: dex knows nothing of it but what the converter says."""

    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (other.amount, other.currency)

    def __hash__(self) -> int:
        return hash((self.amount, self.currency))

    def __repr__(self) -> str:
        return f"Money({self.amount} {self.currency})"

    def to_text(self) -> str:
        if self.currency == "UNPRINTABLE":
            raise Unprintable()
        if self.currency == "BASE":
            raise Shutdown("the hook raised a BaseException")
        return f"{self.amount} {self.currency}"

    @classmethod
    def parse(cls, text: str) -> Money:
        amount, currency = text.split(" ")
        if currency == "EXPLODE":
            raise Shutdown("the decode hook raised a BaseException")
        if currency == "GARBLE":
            raise Unprintable()
        return cls(Decimal(amount), currency)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Shutdown(BaseException):
    pass


class ShopConverter(dex.PayloadConverter):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.register(Money, encode=Money.to_text, decode=Money.parse)


@dataclasses.dataclass(frozen=True)
class Invoice:
    lines: list[Money]
    total: Money
    discount: Money | None = None


@dex.activity
def add_tax(invoice: Invoice) -> Invoice:
    if not all(isinstance(line, Money) for line in invoice.lines):
        raise dex.TerminalError(f"the activity got {invoice!r}")
    total = Money(invoice.total.amount * Decimal("1.2"), invoice.total.currency)
    return Invoice(lines=invoice.lines, total=total)


@dex.workflow
async def bill(ctx: dex.WorkflowContext, invoice: Invoice, fee: Money) -> tuple[Invoice, Money]:
    taxed = await ctx.activity(add_tax, invoice)
    return taxed, fee


@dex.activity
def echo_money(money: Money) -> Money:
    return money


@dex.activity
def make_money(currency: str) -> Money:
    return Money(Decimal(1), currency)


@dex.workflow
async def pay(ctx: dex.WorkflowContext, money: Money) -> Money:
    return await ctx.activity(echo_money, money)  # type: ignore[no-any-return]


@dex.workflow
async def earn(ctx: dex.WorkflowContext, currency: str) -> Money:
    return await ctx.activity(make_money, currency)  # type: ignore[no-any-return]


def _engine(make_engine: Any) -> dex.Engine:
    engine: dex.Engine = make_engine([bill, pay, earn], [add_tax, echo_money, make_money], converter=ShopConverter())
    return engine


def _a_healthy_run_completes(engine: dex.Engine) -> None:
    run_id = engine.start_workflow(pay, Money(Decimal("5.00"), "EUR"))
    engine.drain()
    assert engine.wait(run_id, timeout=5) == Money(Decimal("5.00"), "EUR")


def test_a_registered_type_round_trips_wherever_it_appears(make_engine: Any) -> None:
    engine = _engine(make_engine)
    invoice = Invoice(
        lines=[Money(Decimal("10.00"), "EUR"), Money(Decimal("2.50"), "EUR")], total=Money(Decimal("12.50"), "EUR")
    )
    run_id = engine.start_workflow(bill, invoice, Money(Decimal("0.30"), "EUR"))
    engine.drain()
    taxed, fee = engine.wait(run_id, timeout=5)
    assert taxed == Invoice(lines=invoice.lines, total=Money(Decimal("15.000"), "EUR"))
    assert fee == Money(Decimal("0.30"), "EUR")
    # the history holds the hook's JSON form
    created = engine.history(run_id)[0].event
    assert engine.converter.decode(created.input[0])["total"] == "12.50 EUR"  # type: ignore[attr-defined]


def test_the_default_converter_refuses_the_type_naming_it(make_engine: Any) -> None:
    engine = make_engine([pay], [echo_money])
    with pytest.raises(dex.SerializationError, match="argument 0: value of type Money is not serialisable"):
        engine.start_workflow(pay, Money(Decimal(1), "EUR"))
    assert engine.list_runs() == []


@pytest.mark.parametrize(
    ("currency", "said"), [("UNPRINTABLE", "<unprintable Unprintable"), ("BASE", "Shutdown: the hook")]
)
def test_an_encode_hook_that_raises_is_a_clear_error_at_the_call(make_engine: Any, currency: str, said: str) -> None:
    engine = _engine(make_engine)
    with pytest.raises(dex.SerializationError, match="argument 0: value of type Money is not serialisable") as caught:
        engine.start_workflow(pay, Money(Decimal(1), currency))
    assert said in str(caught.value)
    assert engine.list_runs() == []  # nothing was created
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize(
    ("currency", "said"), [("GARBLE", "<unprintable Unprintable"), ("EXPLODE", "Shutdown: the decode")]
)
def test_a_decode_hook_that_raises_fails_the_run_with_a_recorded_failure(
    make_engine: Any, currency: str, said: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(pay, Money(Decimal(1), currency))  # encodes; the workflow cannot decode it
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "SerializationError"
    assert info.failure.message.startswith("argument 0: cannot decode the payload as Money")  # names the argument
    assert said in info.failure.message
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize(
    ("currency", "said"), [("UNPRINTABLE", "<unprintable Unprintable"), ("BASE", "Shutdown: the hook")]
)
def test_an_activity_result_its_hook_cannot_encode_fails_the_activity(
    make_engine: Any, currency: str, said: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(earn, currency)
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and "value of type Money is not serialisable" in str(info.failure)
    assert said in str(info.failure)
    failed = [e.event for e in engine.history(run_id) if e.kind == "ActivityTaskFailed"]
    assert [f.failure.terminal for f in failed] == [True]  # type: ignore[attr-defined]  # one attempt: no retry loop
    _a_healthy_run_completes(engine)


@pytest.mark.parametrize(
    ("currency", "said"), [("GARBLE", "<unprintable Unprintable"), ("EXPLODE", "Shutdown: the decode")]
)
def test_an_activity_result_its_hook_cannot_decode_fails_at_the_await(
    make_engine: Any, currency: str, said: str
) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(earn, "EUR")  # a healthy one first: the hook is fine with EUR
    engine.drain()
    assert engine.wait(run_id, timeout=5) == Money(Decimal(1), "EUR")
    run_id = engine.start_workflow(earn, currency)  # encodes "1 GARBLE"; the workflow cannot decode it
    engine.drain()
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and "cannot decode the payload as Money" in str(info.failure)
    assert said in str(info.failure)
    _a_healthy_run_completes(engine)
