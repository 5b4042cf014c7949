"""The README demo: an order workflow with a retried activity, a durable timer and an event."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TextIO

import dex
from dex.adapters.memory import InMemoryAdapter

_charges: dict[str, int] = {}


@dex.activity(name="reserve-stock")
def reserve_stock(order_id: str, items: list[str]) -> str:
    return f"reservation-{order_id}-{len(items)}"


@dex.activity(name="charge-card", retry=dex.RetryPolicy(initial_delay=timedelta(milliseconds=300), max_attempts=5))
def charge_card(order_id: str, amount: int) -> str:
    attempt = dex.activity_context().attempt
    _charges[order_id] = attempt
    if attempt < 3:
        raise ConnectionError(f"payment gateway timed out (attempt {attempt})")
    return f"charge-{order_id}-{amount}"


@dex.activity(name="ship")
def ship(order_id: str, reservation: str) -> str:
    return f"parcel-{order_id}"


@dex.workflow(name="order")
async def order_workflow(ctx: dex.WorkflowContext, order_id: str, items: list[str], amount: int) -> dict[str, str]:
    ctx.set_status("reserving stock")
    reservation = await ctx.activity(reserve_stock, order_id, items)
    ctx.set_status("charging card")
    charge = await ctx.activity(charge_card, order_id, amount)
    ctx.set_status("waiting for the cooling-off period")
    await ctx.sleep(timedelta(seconds=1))
    ctx.set_status("waiting for the warehouse")
    packed_by = await ctx.wait_for_event("packed", timeout=timedelta(minutes=5))
    parcel = await ctx.activity(ship, order_id, reservation)
    ctx.set_status("shipped")
    return {"reservation": reservation, "charge": charge, "packed_by": packed_by, "parcel": parcel}


def run_demo(out: TextIO | None = None) -> int:
    """Run one order to completion on background workers, printing each step as it happens."""
    write = (out or sys.stdout).write
    engine = dex.Engine(
        InMemoryAdapter(),
        workflows=[order_workflow],
        activities=[reserve_stock, charge_card, ship],
        poll_interval=0.02,
    )
    with engine:
        run_id = engine.start_workflow(order_workflow, "A-1001", ["book", "lamp"], 4200)
        write(f"started run {run_id}\n")
        seen = 0
        sent = False
        while True:
            info = engine.get_run(run_id)
            history = engine.history(run_id)
            for item in history[seen:]:
                if item.kind not in ("WorkflowTaskStarted", "WorkflowTaskCompleted"):
                    write(f"  {item.sequence_number:>3} {item.kind}\n")
            seen = len(history)
            if info.custom_status == "waiting for the warehouse" and not sent:
                write("  ... the warehouse sends the 'packed' event\n")
                engine.send_event(run_id, "packed", "warehouse-7")
                sent = True
            if info.status.is_terminal:
                break
            time.sleep(0.05)
        result = engine.wait(run_id, timeout=10)
    write(f"charge-card ran {_charges['A-1001']} times (two timeouts were retried)\n")
    write(f"result: {result}\n")
    return 0
