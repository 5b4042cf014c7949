"""The standard workload plus workflows that converse and end well (contract §14), for
``Simulator(workload=CONVERSATION_WORKLOAD)``.

- ``sim-cart`` takes updates: ``add`` (validated, an async handler awaiting an activity) until it
  holds ``wanted`` items, ``peek`` (sync). Clients keep sending updates — some refused by the
  validator or unknown, some repeating an id — while it finishes, so updates race its end.
- ``sim-saga`` charges, sleeps, ships; a cancel (a client's, or its deadline: some start with a
  ``timeout``) reaches it as ``dex.CancelledError``, and its cleanup step (``sim-refund``) runs
  in the ``except`` before the cancel escapes. Clients cancel sagas often, so a cancel races
  an activity's result, and a deadline may fire during the cleanup.
- ``sim-race`` waits each round for the first of a ``ping`` event, a timer and an activity
  (``ctx.first``); a losing event wait is kept and awaited in the next round, so the event it
  did not take stays for a later wait. ``note`` events go to an ``on_event`` handler; the pings
  it reads go to a stream, closed at the end.

Clients send updates straight to the store and read the answers as a caller waiting for them
would (``Clients``: no driving engine). The referee checks, besides every invariant of the
simulator, the ones of :mod:`.invariants` for conversations: updates answered exactly once and
as the callers were told, events never taken by a losing wait, nothing recorded after a run's
end (its streams included), a cancelled saga's cleanup recorded before its end.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import dex
from dex.app.ports.store import RunRecord
from dex.domain.status import RunStatus
from dex.simulation.workload import (
    RESULTS,
    WORKFLOW_BY_NAME,
    WORKFLOWS,
    Workload,
    charge,
    refund,
    ship,
    square,
)

CART, SAGA, RACE = "sim-cart", "sim-saga", "sim-race"


@dex.workflow(name=CART)
async def cart(ctx: dex.WorkflowContext, wanted: int) -> list[int]:
    """Collect ``wanted`` items by update (or what came within a minute)."""
    items: list[int] = []

    @ctx.on_update("add")
    async def add(x: int) -> int:
        items.append(await ctx.activity(square, x))
        return len(items)

    @add.validator
    def _(x: int) -> None:
        if x < 0:
            raise ValueError(f"no negative items ({x})")

    @ctx.on_update("peek")
    def peek() -> int:
        return len(items)

    @ctx.on_query("items")
    def current() -> list[int]:
        return list(items)

    try:
        await ctx.wait_condition(lambda: len(items) >= wanted, timeout=timedelta(seconds=60))
    except dex.WaitTimeoutError:
        pass
    ctx.set_labels({"items": str(len(items))})
    return items


@dex.workflow(name=SAGA)
async def saga(ctx: dex.WorkflowContext, order_id: str, amount: int) -> list[str]:
    """Charge, sleep, ship; cancelled, refund (the cleanup step), then let the cancel escape."""
    done: list[str] = []
    try:
        done.append(await ctx.activity(charge, order_id, amount))
        await ctx.sleep(timedelta(seconds=ctx.random().randint(1, 10)))
        done.append(await ctx.activity(ship, order_id))
        return done
    except dex.CancelledError:
        ctx.publish("undone", len(done))
        try:
            await ctx.activity(refund, order_id, amount)
        except dex.ActivityFailedError:
            pass
        raise


@dex.workflow(name=RACE)
async def race(ctx: dex.WorkflowContext, rounds: int) -> dict[str, list[int]]:
    """Per round, the first of a ping, a timer and an activity; the pings read, and the notes."""
    notes: list[int] = []

    @ctx.on_event("note")
    def on_note(n: int) -> None:
        notes.append(n)

    read: list[int] = []
    ping = ctx.wait_for_event("ping")
    for r in range(rounds):
        timer = ctx.sleep(timedelta(seconds=ctx.random().randint(1, 8)))
        crunching = ctx.activity(square, r)
        try:
            index, value = await ctx.first(ping, timer, crunching)
        except dex.ActivityFailedError:
            index, value = 2, None
        if index == 0:
            read.append(value)
            await ctx.write_stream("pings", value)
            ping = ctx.wait_for_event("ping")  # the next ping; a losing wait stays for the next round
        if index != 1:
            timer.cancel()
        if index != 2:
            crunching.cancel()
    ctx.close_stream("pings")
    return {"read": read, "notes": notes}


CONVERSATION_WORKFLOWS: tuple[Callable[..., Any], ...] = (cart, saga, race)


class ConversationWorkload(Workload):
    """The standard workload, and carts, sagas and races for most starts (module docstring)."""

    workflows = (*WORKFLOWS, *CONVERSATION_WORKFLOWS)
    # the workflows whose code catches a cancel and runs a cleanup step: its name
    cleanups: Mapping[str, str] = {SAGA: "sim-refund"}
    # the events whose reads a run's result lists (checked against what it received)
    reads: Mapping[str, str] = {RACE: "ping"}

    def workflow(self, name: str) -> Callable[..., Any]:
        ours: dict[str, Callable[..., Any]] = {CART: cart, SAGA: saga, RACE: race}
        return ours.get(name) or WORKFLOW_BY_NAME[name]

    def start(self, engine: dex.Engine, rng: random.Random, serial: int) -> str:
        kind = rng.choice(["cart", "cart", "saga", "saga", "race", "standard"])
        if kind == "cart":
            return engine.start_workflow(cart, rng.randint(1, 3))
        if kind == "saga":
            timeout = rng.choice([None, None, None, 8, 20, 60])
            return engine.start_workflow(saga, f"s{serial}", rng.randint(1, 99), timeout=timeout)
        if kind == "race":
            return engine.start_workflow(race, rng.randint(1, 3))
        return super().start(engine, rng, serial)

    def listens(self, workflow_name: str) -> bool:
        return workflow_name == RACE or super().listens(workflow_name)

    def event_for(self, workflow_name: str, rng: random.Random) -> tuple[str, Any] | None:
        if workflow_name == RACE:
            return rng.choice(["ping", "ping", "note"]), rng.randint(1, 99)
        return super().event_for(workflow_name, rng)

    def takes_updates(self, workflow_name: str) -> bool:
        return workflow_name == CART

    def update_for(self, rng: random.Random) -> tuple[str, tuple[Any, ...]]:
        """An update a client sends to a cart: mostly ``add`` (some refused), ``peek``, or one
        no handler takes."""
        roll = rng.random()
        if roll < 0.65:
            return "add", (rng.randint(-2, 9),)
        if roll < 0.9:
            return "peek", ()
        return "nope", ()

    def cancels_often(self, workflow_name: str) -> bool:
        return workflow_name == SAGA

    def check_outcome(self, record: RunRecord, inputs: list[Any], result: Any) -> str | None:
        name = record.workflow_name
        if name not in (CART, SAGA, RACE):
            return super().check_outcome(record, inputs, result)
        if record.status in (RunStatus.CANCELLED, RunStatus.TERMINATED):
            return None
        if record.status is RunStatus.FAILED:
            assert record.failure is not None
            allowed = name == SAGA and record.failure.type == "ActivityFailedError"
            return None if allowed else f"failed with {record.failure.type}: {record.failure.message}"
        if name == CART:
            squares = {x * x for x in range(10)}
            if not isinstance(result, list) or any(item not in squares for item in result):
                return f"a cart of {result!r}"
            return None
        if name == SAGA:
            order_id, amount = inputs
            expected = [RESULTS["sim-charge"](order_id, amount), RESULTS["sim-ship"](order_id)]
            return None if result == expected else f"expected {expected!r}, got {result!r}"
        (rounds,) = inputs
        if not isinstance(result, dict) or len(result["read"]) > rounds:
            return f"{rounds} rounds read {result!r}"
        return None


CONVERSATION_WORKLOAD = ConversationWorkload()
