"""The README demo: a durable order workflow on PostgreSQL that survives Ctrl-C, its card charge
retried twice (each failed attempt printed as it happens, with the time of the next).

It uses ``DEX_DATABASE_URL`` or, without one, an embedded PostgreSQL under ``.dex-data/``. The
order has a fixed instance id, so running the demo again while the order is unfinished resumes
the same run where it stopped, instead of starting a new one.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TextIO

import dex

INSTANCE_ID = "demo-order-A-1001"
QUIET_KINDS = ("WorkflowTaskStarted", "WorkflowTaskCompleted")


@dex.activity(name="reserve-stock")
def reserve_stock(order_id: str, items: list[str]) -> str:
    return f"reservation-{order_id}-{len(items)}"


@dex.activity(name="charge-card", retry=dex.RetryPolicy(initial_delay=timedelta(milliseconds=500), max_attempts=5))
def charge_card(order_id: str, amount: int) -> str:
    attempt = dex.activity_context().attempt
    if attempt < 3:
        raise ConnectionError(f"payment gateway timed out (attempt {attempt})")
    return f"charge-{order_id}-{amount}-after-{attempt}-attempts"


@dex.activity(name="ship")
def ship(order_id: str, reservation: str) -> str:
    return f"parcel-{order_id}"


@dex.workflow(name="order")
async def order_workflow(ctx: dex.WorkflowContext, order_id: str, items: list[str], amount: int) -> dict[str, str]:
    ctx.set_status("reserving stock")
    reservation = await ctx.activity(reserve_stock, order_id, items)
    ctx.set_status("charging card")
    charge = await ctx.activity(charge_card, order_id, amount)
    ctx.set_status("cooling-off period")
    await ctx.sleep(timedelta(seconds=5))
    ctx.set_status("waiting for the warehouse")
    packed_by = await ctx.wait_for_event("packed", timeout=timedelta(minutes=5))
    parcel = await ctx.activity(ship, order_id, reservation)
    ctx.set_status("shipped")
    return {"reservation": reservation, "charge": charge, "packed_by": packed_by, "parcel": parcel}


def describe(item: dex.HistoryEvent) -> str:
    event = item.event
    detail = getattr(event, "name", "") or getattr(event, "event_id", "")
    if item.kind == "TimerCreated":
        detail = f"fires at {event.fire_at:%H:%M:%S}"  # type: ignore[union-attr]
    return f"{item.sequence_number:>4}  {item.timestamp:%H:%M:%S.%f}"[:-3] + f"  {item.kind} {detail}".rstrip()


def retries(steps: list[dex.ActivityStep], told: set[tuple[int, int, str]]) -> list[str]:
    """A line for each failed or lost attempt of ``steps`` not yet in ``told`` (which it adds
    to), oldest first: retried attempts are not history, so the store's attempts say them."""
    lines = []
    for step in steps:
        for attempt in reversed(step.recent):
            key = (step.seq, attempt.attempt, attempt.kind)
            if key in told:
                continue
            told.add(key)
            failure = f"{attempt.failure.type}: {attempt.failure.message}"
            line = f"      {step.name} attempt {attempt.attempt} {attempt.kind}: {failure}"
            newest = attempt is step.recent[0]
            if newest and step.status == "retrying" and step.next_retry_at is not None:
                line += f"; retrying at {step.next_retry_at:%H:%M:%S.%f}"[:-3]
            elif newest and step.status == "failed":
                line += f"; giving up after {step.attempts} attempts"
            lines.append(line)
    return lines


def run_demo(database_url: str, *, schema: str = "dex_demo", out: TextIO | None = None) -> int:
    """Run (or resume) the demo order on background workers, printing its history as it grows."""
    from dex.adapters.postgres import PostgresAdapter

    write = (out or sys.stdout).write
    adapter = PostgresAdapter(database_url, schema=schema)
    engine = dex.Engine(
        adapter, workflows=[order_workflow], activities=[reserve_stock, charge_card, ship], poll_interval=0.05
    )
    engine.start()
    try:
        run_id = engine.start_workflow(order_workflow, "A-1001", ["book", "lamp"], 4200, instance_id=INSTANCE_ID)
        history = engine.history(run_id)
        if len(history) > 1:
            write(f"resuming run {run_id} where it stopped ({len(history)} events recorded so far)\n")
        else:
            write(f"started run {run_id}; press Ctrl-C at any time, then run the demo again to resume it\n")
        seen, sent = 0, False
        told: set[tuple[int, int, str]] = set()
        while True:
            info = engine.get_run(run_id)
            steps = engine.activity_steps(run_id)  # the attempts first: a retry is not history
            history = engine.history(run_id)
            for item in history[seen:]:
                if item.kind not in QUIET_KINDS:
                    write(describe(item) + "\n")
            seen = len(history)
            for line in retries(steps, told):
                write(line + "\n")
            if info.custom_status == "waiting for the warehouse" and not sent:
                write("      ... the warehouse sends the 'packed' event\n")
                engine.send_event(run_id, "packed", "warehouse-7")
                sent = True
            if info.status.is_terminal:
                break
            time.sleep(0.1)
        result = engine.wait(run_id, timeout=10)
        write(f"result: {result}\n")
        return 0
    except KeyboardInterrupt:
        write("\ninterrupted: stopping the workers gracefully; run the demo again to resume\n")
        return 130
    finally:
        engine.stop()
        adapter.close()
