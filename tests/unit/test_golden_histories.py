"""Golden histories: runs recorded by earlier code (``tests/golden/*.binpb``) must keep replaying.

Each file holds a ``dex.v1.WorkflowHistory`` exported by ``tests/golden/record.py`` from the
workflows in ``tests/golden/workflows.py``. A failure here means today's engine no longer
reads or replays what it wrote before: a change to the wire format, the codec or replay
that would strand running workflows after an upgrade.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.domain import events as ev
from dex.domain.state import fold
from dex.serialization import PayloadConverter
from tests.golden import workflows as golden
from tests.golden.workflows import ACTIVITIES, GOLDEN_FILES, WORKFLOWS

GOLDEN_DIR = Path(golden.__file__).resolve().parent

# What each file exists to cover; a re-recording that lost one of these would go unnoticed.
REQUIRED_KINDS = {
    "order": {"ActivityTaskCreated", "ActivityTaskCompleted", "SideEffectExecuted"},
    "approval": {"TimerCreated", "TimerElapsed", "ExternalEventReceived"},
    "parent": {"ChildRunCreated", "ChildRunCompleted", "ChildRunFailed"},
    "child": {"ActivityTaskCreated", "TimerCreated", "TimerElapsed"},
    "patched": {"PatchApplied", "ActivityTaskCreated", "ActivityTaskCompleted"},
    "typed": {"ActivityTaskCreated", "ActivityTaskCompleted", "SideEffectExecuted"},
}


def golden_bytes(name: str) -> bytes:
    return (GOLDEN_DIR / f"{name}.binpb").read_bytes()


def test_every_golden_file_has_a_workflow_and_every_workflow_a_file() -> None:
    files = {path.stem for path in GOLDEN_DIR.glob("*.binpb")}
    assert files == set(GOLDEN_FILES) == set(REQUIRED_KINDS)


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_history_replays(name: str) -> None:
    history = dex.testing.load_history(golden_bytes(name))
    workflow = GOLDEN_FILES[name]
    assert isinstance(history[0].event, ev.RunCreated)
    assert history[0].event.workflow_name == workflow.__dex_workflow__.name  # type: ignore[attr-defined]
    assert REQUIRED_KINDS[name] <= {item.kind for item in history}
    completed = history[-2].event
    assert isinstance(completed, ev.RunCompleted) and completed.status is dex.RunStatus.COMPLETED
    assert fold(history).status is dex.RunStatus.COMPLETED

    calls_before = sum(golden.SIDE_EFFECT_CALLS.values())
    dex.testing.replay(workflow, history, activities=ACTIVITIES, workflows=WORKFLOWS)
    dex.testing.replay(workflow, golden_bytes(name), activities=ACTIVITIES, workflows=WORKFLOWS)
    assert sum(golden.SIDE_EFFECT_CALLS.values()) == calls_before, "replay ran a recorded side effect again"


def test_golden_order_records_the_retried_activity_once() -> None:
    # the first attempt of golden-reserve failed and was retried 2 s later: only the outcome is history
    history = dex.testing.load_history(golden_bytes("order"))
    reserve_created = [
        i for i in history if isinstance(i.event, ev.ActivityTaskCreated) and i.event.name == "golden-reserve"
    ]
    assert len(reserve_created) == 1
    outcome = next(
        i
        for i in history
        if isinstance(i.event, ev.ActivityTaskCompleted) and i.event.created_seq == reserve_created[0].sequence_number
    )
    assert outcome.timestamp - reserve_created[0].timestamp == timedelta(seconds=2)


# -- changed code is caught -----------------------------------------------------------------------


@dex.workflow(name="golden-order")
async def order_reserving_differently(ctx: dex.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    # changed: reserves one more than asked
    reservation = await ctx.activity(golden.reserve, request["item"], request["quantity"] + 1)
    prices = await ctx.gather(*(ctx.activity(golden.price, extra) for extra in request["extras"]))
    code = ctx.side_effect("confirmation-code", golden.confirmation_code, request["item"])
    await ctx.activity(golden.notify, f"{reservation} ({code})")
    return {"reservation": reservation, "total": sum(prices), "code": code}


@dex.workflow(name="golden-order")
async def order_pricing_first(ctx: dex.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    # changed: prices the extras before reserving
    prices = await ctx.gather(*(ctx.activity(golden.price, extra) for extra in request["extras"]))
    reservation = await ctx.activity(golden.reserve, request["item"], request["quantity"])
    return {"reservation": reservation, "total": sum(prices)}


@dex.workflow(name="golden-approval")
async def approval_with_a_shorter_timer(ctx: dex.WorkflowContext, request: str) -> dict[str, Any]:
    # changed: sleeps 5 minutes instead of 10
    await ctx.sleep(timedelta(minutes=5))
    first = await ctx.wait_for_event("approve")
    return {"request": request, "approvers": [first]}


@dex.workflow(name="golden-parent")
async def parent_with_an_activity(ctx: dex.WorkflowContext, n: int) -> dict[str, Any]:
    # changed: an activity where the first child was started
    first = await ctx.activity(golden.double, n)
    return {"children": [first]}


@pytest.mark.parametrize(
    ("name", "changed", "recorded", "requested"),
    [
        (
            "order",
            order_reserving_differently,
            "activity 'golden-reserve' at event 4",
            "activity 'golden-reserve' with a different arguments",
        ),
        ("order", order_pricing_first, "activity 'golden-reserve' at event 4", "activity 'golden-price'"),
        (
            "approval",
            approval_with_a_shorter_timer,
            "timer firing at 2024-01-01T00:10:00+00:00",
            "timer firing at 2024-01-01T00:05:00+00:00",
        ),
        ("parent", parent_with_an_activity, "child workflow 'golden-child' at event 4", "activity 'golden-double'"),
    ],
    ids=["argument", "order-of-steps", "timer", "child-vs-activity"],
)
def test_changed_workflow_fails_replay_of_a_golden_file(
    name: str, changed: Callable[..., Any], recorded: str, requested: str
) -> None:
    with pytest.raises(dex.NonDeterminismError) as caught:
        dex.testing.replay(changed, golden_bytes(name), activities=ACTIVITIES, workflows=WORKFLOWS)
    message = str(caught.value)
    assert f"history recorded {recorded}" in message
    assert f"asked for {requested}" in message


# -- patches (docs/reference/contract.md §11): the old branch replays old histories, the new one its own ----------------


@dex.workflow(name="golden-order")
async def order_with_a_patch(ctx: dex.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    # v2 reserves one more, behind a patch: the golden run was recorded without it
    extra = 1 if ctx.patched("golden-reserve-spare") else 0
    reservation = await ctx.activity(golden.reserve, request["item"], request["quantity"] + extra)
    prices = await ctx.gather(*(ctx.activity(golden.price, extra) for extra in request["extras"]))
    code = ctx.side_effect("confirmation-code", golden.confirmation_code, request["item"])
    ctx.set_status("reserved")
    await ctx.activity(golden.notify, f"{reservation} ({code})")
    return {"reservation": reservation, "total": sum(prices), "code": code}


@dex.workflow(name="golden-patched")
async def patched_without_the_patch(ctx: dex.WorkflowContext, item: str) -> dict[str, Any]:
    cost = await ctx.activity(golden.price, item)  # the old code, from before the patch
    return {"cost": cost, "patched": False}


@dex.workflow(name="golden-patched")
async def patched_deprecated(ctx: dex.WorkflowContext, item: str) -> dict[str, Any]:
    ctx.deprecate_patch("golden-gift-wrap")  # only the new branch is left
    cost = await ctx.activity(golden.price, item)
    cost += await ctx.activity(golden.price, "wrapping")
    return {"cost": cost, "patched": True}


def test_a_patch_replays_a_history_recorded_before_it_on_the_old_branch() -> None:
    dex.testing.replay(order_with_a_patch, golden_bytes("order"), activities=ACTIVITIES, workflows=WORKFLOWS)


def test_a_history_that_took_a_patch_replays_with_the_patch_or_its_deprecation_only() -> None:
    history = dex.testing.load_history(golden_bytes("patched"))
    assert [item.event for item in history if isinstance(item.event, ev.PatchApplied)] == [
        ev.PatchApplied(patch_id="golden-gift-wrap")
    ]
    dex.testing.replay(patched_deprecated, history, activities=ACTIVITIES, workflows=WORKFLOWS)
    with pytest.raises(dex.NonDeterminismError, match="history recorded patch 'golden-gift-wrap' at event"):
        dex.testing.replay(patched_without_the_patch, history, activities=ACTIVITIES, workflows=WORKFLOWS)


# -- typed values (docs/reference/contract.md §15): their JSON form is part of the history ------------------------


def test_the_typed_golden_history_holds_typed_values_as_plain_json() -> None:
    history = dex.testing.load_history(golden_bytes("typed"))
    created = history[0].event
    assert isinstance(created, ev.RunCreated)
    assert json.loads(created.input[0].data) == {
        "shipment_id": "5b0c8c0e-3b1e-4c57-9a36-0b8f6f1c2d4e",
        "ready": "2024-01-02T08:30:00+00:00",
        "due": "2024-01-05",
        "window": "PT10800.00025S",
        "value": "1999.90",
        "tier": "gold",
        "labels": ["fragile", "heavy", "this-side-up"],
        "manifest": "AG1hbmlmZXN0/w==",
        "legs": ["LYS", "CDG", "JFK"],
        "note": 7,
    }
    # decoded with the workflow's hint, it is the value that was sent
    shipment = PayloadConverter().decode(created.input[0], golden.Shipment)
    assert shipment.value == Decimal("1999.90") and shipment.labels == frozenset({"fragile", "heavy", "this-side-up"})
    assert shipment.window == timedelta(hours=3, microseconds=250) and shipment.manifest == b"\x00manifest\xff"


@dex.workflow(name="golden-typed")
async def typed_with_another_rate(ctx: dex.WorkflowContext, shipment: golden.Shipment) -> dict[str, Any]:
    # changed: a rate equal in value, written with another exponent: a Decimal keeps its digits
    premium = await ctx.activity(golden.insure, shipment, Decimal("0.0150"))
    return {"premium": premium}


def test_a_typed_argument_written_differently_fails_replay() -> None:
    with pytest.raises(dex.NonDeterminismError, match="activity 'golden-insure' with a different arguments"):
        dex.testing.replay(typed_with_another_rate, golden_bytes("typed"), activities=ACTIVITIES, workflows=WORKFLOWS)
