"""A widget store's checkout that tells the shop how it is going (docs/reference/contract.md §14).

The workflow publishes the order's status at every stage (``ctx.publish("status", ...)``),
which the shop's order page reads with ``engine.get_published``, and writes an order log to a
stream (``ctx.write_stream("log", ...)``), which a page follows with ``engine.read_stream`` (or
``GET /v1/runs/{run_id}/streams/log`` as server-sent events). The packing activity streams each
widget it packs. The customer confirms delivery with an event; the log is closed then.

    python examples/widget_checkout.py                  # in memory
    DEX_DATABASE_URL=postgresql://... python examples/widget_checkout.py [--schema NAME]
"""

from __future__ import annotations

import argparse
import os
import threading

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import Store

CART = {"sprocket": 2, "flange": 1}
PRICES = {"sprocket": 450, "flange": 1200}


@dex.activity(name="widget-reserve")
def reserve(cart: dict[str, int]) -> str:
    return f"reservation-{sum(cart.values())}"


@dex.activity(name="widget-charge")
def charge(amount: int) -> str:
    return f"charge-{amount}"


@dex.activity(name="widget-pack")
def pack(cart: dict[str, int]) -> int:
    packed = 0
    for widget, count in sorted(cart.items()):
        for n in range(count):
            packed += 1
            dex.activity_context().write_stream("log", f"packed {widget} {n + 1} of {count}")
    return packed


@dex.workflow(name="widget-checkout")
async def checkout(ctx: dex.WorkflowContext, order_id: str, cart: dict[str, int]) -> dict[str, str]:
    ctx.publish("status", "reserving")
    reservation = await ctx.activity(reserve, cart)
    await ctx.write_stream("log", f"reserved: {reservation}")
    total = sum(PRICES[widget] * count for widget, count in cart.items())
    ctx.publish("status", "charging")
    receipt = await ctx.activity(charge, total)
    await ctx.write_stream("log", f"charged {total} cents: {receipt}")
    ctx.publish("status", "packing")
    packed = await ctx.activity(pack, cart)
    await ctx.write_stream("log", f"shipped {packed} widgets")
    ctx.publish("status", "shipped")
    delivered = await ctx.wait_for_event("delivered")
    await ctx.write_stream("log", f"delivered, signed by {delivered}")
    ctx.close_stream("log")
    ctx.publish("status", "delivered")
    return {"order": order_id, "receipt": receipt}


def adapter(schema: str) -> Store:
    url = os.environ.get("DEX_DATABASE_URL")
    if not url:
        return InMemoryAdapter()
    from dex.adapters.postgres import PostgresAdapter

    return PostgresAdapter(url, schema=schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schema", default="dex_examples")
    store = adapter(parser.parse_args().schema)
    with dex.Engine(store, workflows=[checkout], activities=[reserve, charge, pack], poll_interval=0.01) as engine:
        run_id = engine.start_workflow(checkout, "W-1001", CART)
        log: list[str] = []
        reader = threading.Thread(target=lambda: log.extend(engine.read_stream(run_id, "log", timeout=30)))
        reader.start()  # the order page follows the log while the checkout goes on
        for status in engine.watch_published(run_id, "status", timeout=30):
            print(f"status: {status}", flush=True)
            if status == "shipped":
                engine.send_event(run_id, "delivered", "Ada")  # the customer confirms
        reader.join(30)
        for line in log:
            print(f"log: {line}")
        print(f"result: {engine.wait(run_id, timeout=30)}")
    store.close()


if __name__ == "__main__":
    main()
