"""The dex workflows and activities the benchmarks run (plain public API, nothing special)."""

from __future__ import annotations

from datetime import timedelta

import dex


@dex.activity(name="bench-inc")
def inc(x: int) -> int:
    return x + 1


@dex.activity(name="bench-double")
def double(x: int) -> int:
    return x * 2


@dex.activity(name="bench-dec")
def dec(x: int) -> int:
    return x - 1


@dex.workflow(name="bench-three")
async def three(ctx: dex.WorkflowContext, x: int) -> int:
    """The benchmark workflow: three sequential activities, (x + 1) * 2 - 1."""
    x = await ctx.activity(inc, x)
    x = await ctx.activity(double, x)
    return await ctx.activity(dec, x)


@dex.workflow(name="bench-chain")
async def chain(ctx: dex.WorkflowContext, n: int) -> int:
    """``n`` sequential activities (the history grows with n)."""
    x = 0
    for _ in range(n):
        x = await ctx.activity(inc, x)
    return x


@dex.workflow(name="bench-waiter")
async def waiter(ctx: dex.WorkflowContext, x: int) -> int:
    """One activity, then a timer a year away: a run that waits."""
    x = await ctx.activity(inc, x)
    await ctx.sleep(timedelta(days=365))
    return x


WORKFLOWS = [three, chain, waiter]
ACTIVITIES = [inc, double, dec]


def expected_three(x: int) -> int:
    return (x + 1) * 2 - 1
