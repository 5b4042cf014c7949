"""The workflows and activities behind the golden histories in this directory.

DO NOT CHANGE the code below once its history is recorded: the point of a golden file is
that the *engine* keeps replaying histories that unchanged code recorded long ago. A new
behaviour gets a new workflow (new name) and a new file, recorded by ``record.py``.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import dex

# How often each side-effect function really ran; replay must not run it again.
SIDE_EFFECT_CALLS: Counter[str] = Counter()


# -- golden-order: an activity that is retried, a gather, a side effect, a custom status --------


@dex.activity(
    name="golden-reserve",
    retry=dex.RetryPolicy(initial_delay=timedelta(seconds=2), randomization_factor=0.0, max_attempts=3),
)
def reserve(item: str, quantity: int) -> str:
    if dex.activity_context().attempt == 1:
        raise RuntimeError("the warehouse is busy")  # retried: the retry is not history
    return f"{quantity} x {item}"


@dex.activity(name="golden-price")
def price(item: str) -> int:
    return 100 * len(item)


@dex.activity(name="golden-notify")
def notify(text: str) -> None:
    pass


def confirmation_code(item: str) -> str:
    SIDE_EFFECT_CALLS["confirmation_code"] += 1
    return f"C-{item.upper()}"


@dex.workflow(name="golden-order")
async def order(ctx: dex.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    reservation = await ctx.activity(reserve, request["item"], request["quantity"])
    prices = await ctx.gather(*(ctx.activity(price, extra) for extra in request["extras"]))
    code = ctx.side_effect("confirmation-code", confirmation_code, request["item"])
    ctx.set_status("reserved")
    await ctx.activity(notify, f"{reservation} ({code})")
    return {"reservation": reservation, "total": sum(prices), "code": code}


# -- golden-approval: a timer, buffered external events (FIFO per id), a wait that times out ----


@dex.workflow(name="golden-approval")
async def approval(ctx: dex.WorkflowContext, request: str) -> dict[str, Any]:
    await ctx.sleep(timedelta(minutes=10))
    first = await ctx.wait_for_event("approve")
    second = await ctx.wait_for_event("approve", timeout=timedelta(hours=1))
    try:
        escalation = await ctx.wait_for_event("escalate", timeout=timedelta(minutes=5))
    except dex.WaitTimeoutError:
        escalation = None
    comment = await ctx.wait_for_event("comment")
    return {"request": request, "approvers": [first, second], "escalation": escalation, "comment": comment}


# -- golden-parent / golden-child: child workflows, alone and gathered, one failing -------------


@dex.activity(name="golden-double")
def double(n: int) -> int:
    return 2 * n


@dex.workflow(name="golden-child")
async def child(ctx: dex.WorkflowContext, n: int) -> int:
    if n < 0:
        raise ValueError(f"cannot work on {n}")
    doubled: int = await ctx.activity(double, n)
    await ctx.sleep(30)
    return doubled


@dex.workflow(name="golden-parent")
async def parent(ctx: dex.WorkflowContext, n: int) -> dict[str, Any]:
    first, second = await ctx.gather(ctx.child(child, n), ctx.child(child, n + 1))
    failure: str | None
    try:
        await ctx.child(child, -n)
    except dex.ChildWorkflowFailedError as exc:
        failure = exc.failure.message
    else:
        failure = None
    return {"children": [first, second], "failure": failure}


# -- golden-patched: a run that took the new branch of ctx.patched (PatchApplied, docs/reference/contract.md §11) ------


@dex.workflow(name="golden-patched")
async def patched(ctx: dex.WorkflowContext, item: str) -> dict[str, Any]:
    before = ctx.patched("golden-gift-wrap")  # recorded: PatchApplied before the first step
    cost = await ctx.activity(price, item)
    if ctx.patched("golden-gift-wrap"):  # asked again: the same answer, nothing more recorded
        cost += await ctx.activity(price, "wrapping")
    return {"cost": cost, "patched": before}


# -- golden-typed: typed values as arguments, results and a side effect (docs/reference/contract.md §15) -----------


class Tier(enum.Enum):
    BASIC = "basic"
    GOLD = "gold"


@dataclasses.dataclass(frozen=True)
class Shipment:
    shipment_id: uuid.UUID
    ready: datetime
    due: date
    window: timedelta
    value: Decimal
    tier: Tier
    labels: frozenset[str]
    manifest: bytes
    legs: tuple[str, ...]
    note: str | int | None = None


@dex.activity(name="golden-insure")
def insure(shipment: Shipment, rate: Decimal) -> dict[str, Decimal]:
    return {"premium": (shipment.value * rate).quantize(Decimal("0.01")), "value": shipment.value}


@dex.activity(name="golden-schedule")
def schedule_pickup(ready: datetime, window: timedelta) -> tuple[datetime, datetime]:
    return ready, ready + window


@dex.workflow(name="golden-typed")
async def typed(ctx: dex.WorkflowContext, shipment: Shipment) -> dict[str, Any]:
    premium = await ctx.activity(insure, shipment, Decimal("0.015"))
    pickup = await ctx.activity(schedule_pickup, shipment.ready, shipment.window)
    stamp = ctx.side_effect("golden-stamp", _stamp, shipment.shipment_id)
    return {"premium": premium, "pickup": pickup, "labels": shipment.labels, "stamp": stamp}


def _stamp(shipment_id: uuid.UUID) -> set[str]:
    SIDE_EFFECT_CALLS["golden-stamp"] += 1
    return {str(shipment_id), "stamped"}


ACTIVITIES = (reserve, price, notify, double, insure, schedule_pickup)
WORKFLOWS = (order, approval, parent, child, patched, typed)

# golden file (without ".binpb") -> the workflow that recorded it
GOLDEN_FILES: dict[str, Callable[..., Any]] = {
    "order": order,
    "approval": approval,
    "parent": parent,
    "child": child,
    "patched": patched,
    "typed": typed,
}
