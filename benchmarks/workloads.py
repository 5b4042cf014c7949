"""The dex workflows and activities the benchmarks run (plain public API, nothing special)."""

from __future__ import annotations

import asyncio
import time
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


# I/O-bound activities: each waits IO_SECONDS (as a call to a service would); with CPU_SECONDS,
# each also computes that long (holding the GIL, as pure-Python work does)
IO_SECONDS = 0.02
CPU_SECONDS = 0.0


def _work() -> None:
    if IO_SECONDS:
        time.sleep(IO_SECONDS)
    if CPU_SECONDS:
        until = time.thread_time() + CPU_SECONDS
        while time.thread_time() < until:
            pass


@dex.activity(name="bench-io-inc")
def io_inc(x: int) -> int:
    _work()
    return x + 1


@dex.activity(name="bench-io-double")
def io_double(x: int) -> int:
    _work()
    return x * 2


@dex.activity(name="bench-io-dec")
def io_dec(x: int) -> int:
    _work()
    return x - 1


@dex.workflow(name="bench-io-three")
async def io_three(ctx: dex.WorkflowContext, x: int) -> int:
    """The benchmark workflow with I/O-bound activities: the same result, 3 × IO_SECONDS of waiting."""
    x = await ctx.activity(io_inc, x)
    x = await ctx.activity(io_double, x)
    return await ctx.activity(io_dec, x)


# the same I/O awaited instead of slept through (``asyncio.sleep``, as an asyncio HTTP client
# waits): ``async def`` activities, which a started engine awaits on its event loop
@dex.activity(name="bench-aio-inc")
async def aio_inc(x: int) -> int:
    await asyncio.sleep(IO_SECONDS)
    return x + 1


@dex.activity(name="bench-aio-double")
async def aio_double(x: int) -> int:
    await asyncio.sleep(IO_SECONDS)
    return x * 2


@dex.activity(name="bench-aio-dec")
async def aio_dec(x: int) -> int:
    await asyncio.sleep(IO_SECONDS)
    return x - 1


@dex.workflow(name="bench-aio-three")
async def aio_three(ctx: dex.WorkflowContext, x: int) -> int:
    """``io_three`` with ``async def`` activities."""
    x = await ctx.activity(aio_inc, x)
    x = await ctx.activity(aio_double, x)
    return await ctx.activity(aio_dec, x)  # type: ignore[no-any-return]


WORKFLOWS = [three, chain, waiter, io_three, aio_three]
ACTIVITIES = [inc, double, dec, io_inc, io_double, io_dec, aio_inc, aio_double, aio_dec]


def expected_three(x: int) -> int:
    return (x + 1) * 2 - 1
