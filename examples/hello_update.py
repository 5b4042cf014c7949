"""Updates: tell a running workflow something and get its answer (docs/how-to/talk-to-a-running-workflow.md).

A cart workflow takes items through the update "add-item", whose validator refuses empty
names, and ends at the update "checkout". Run it as it is (an in-memory store and a virtual
clock: the engine is not started, so each ``update`` drives it as ``drain`` would), or with
``DEX_DATABASE_URL`` set, on PostgreSQL with a started engine (schema ``DEX_SCHEMA``, default
``dex_examples``):

    python examples/hello_update.py
"""

from __future__ import annotations

import os

import dex


@dex.activity(name="hello-price")
def price_of(item: str) -> int:
    return 100 * len(item)  # real I/O (a price service) goes here


@dex.workflow(name="hello-cart")
async def cart(ctx: dex.WorkflowContext, customer: str) -> dict[str, object]:
    items: list[str] = []
    total = 0
    done = False

    @ctx.on_update("add-item")
    async def add_item(item: str) -> dict[str, int]:
        nonlocal total
        total += await ctx.activity(price_of, item)  # an update handler may await steps
        items.append(item)
        return {"items": len(items), "total": total}

    @add_item.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_update("checkout")
    def checkout() -> int:
        nonlocal done
        done = True
        return total

    await ctx.wait_condition(lambda: done)
    return {"customer": customer, "items": items, "total": total}


def make_engine() -> dex.Engine:
    url = os.environ.get("DEX_DATABASE_URL")
    if url:
        from dex.adapters.postgres import PostgresAdapter

        adapter = PostgresAdapter(url, schema=os.environ.get("DEX_SCHEMA", "dex_examples"))
        return dex.Engine(adapter, workflows=[cart], activities=[price_of])
    from dex.adapters.memory import InMemoryAdapter
    from dex.testing import VirtualClock

    return dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[cart], activities=[price_of])


def main() -> None:
    engine = make_engine()
    started = bool(os.environ.get("DEX_DATABASE_URL"))
    if started:
        engine.start()
    try:
        run_id = engine.start_workflow(cart, "ann")
        print("add lamp ->", engine.update(run_id, "add-item", "lamp", update_id="ann-lamp", timeout=30))
        print("add desk ->", engine.update(run_id, "add-item", "desk", timeout=30))
        # the same update id again: the handler does not run twice, the recorded answer comes back
        print("add lamp again ->", engine.update(run_id, "add-item", "lamp", update_id="ann-lamp", timeout=30))
        try:
            engine.update(run_id, "add-item", "", timeout=30)
        except dex.UpdateRejectedError as exc:
            print("refused:", exc.failure.message)
        print("checkout ->", engine.update(run_id, "checkout", timeout=30))
        print("result:", engine.wait(run_id, timeout=30))
    finally:
        if started:
            engine.stop()
        engine.store.close()


if __name__ == "__main__":
    main()
