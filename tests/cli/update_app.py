"""An application module for ``dex runs query --app tests.cli.update_app:make_engine``: an engine
with the workflow of ``tests/cli/test_updates.py``, over the schema the test names."""

from __future__ import annotations

import os

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.workflow(name="cli-cart")
async def cli_cart(ctx: dex.WorkflowContext) -> list[str]:
    items: list[str] = []

    @ctx.on_update("add")
    def add(item: str) -> int:
        items.append(item)
        return len(items)

    @add.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_update("fail")
    def fail() -> None:
        raise RuntimeError("out of stock")

    @ctx.on_query("items")
    def current(prefix: str = "") -> list[str]:
        return [prefix + item for item in items]

    await ctx.wait_condition(lambda: "done" in items)
    return items


def make_engine() -> dex.Engine:
    adapter = PostgresAdapter(os.environ["DEX_DATABASE_URL"], schema=os.environ["DEX_TEST_CLI_SCHEMA"], migrate=False)
    return dex.Engine(adapter, workflows=[cli_cart])
