"""The asyncio facade: an application on an event loop starts and waits without blocking it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import dex


@dex.activity
async def fetch(x: int) -> int:
    await asyncio.sleep(0.01)  # async activities run on the worker's own event loop
    return x * 10


@dex.workflow
async def fetches(ctx: dex.WorkflowContext, xs: list[int]) -> int:
    values = await ctx.gather(*(ctx.activity(fetch, x) for x in xs))
    await ctx.wait_for_event("go")
    return sum(values)


def test_async_facade_starts_signals_and_waits(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[fetches], activities=[fetch], poll_interval=0.01)

    async def application() -> tuple[int, int]:
        ticks = 0

        async def ticker() -> None:  # proves the loop keeps running while we wait
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        run_id = await engine.start_workflow_async(fetches, [1, 2, 3])
        await engine.send_event_async(run_id, "go")
        result = await engine.wait_async(run_id, timeout=20)
        info = await engine.get_run_async(run_id)
        assert info.status is dex.RunStatus.COMPLETED
        assert [r.run_id for r in await engine.list_runs_async(workflow_name="fetches")] == [run_id]
        assert (await engine.history_async(run_id))[0].kind == "RunCreated"
        task.cancel()
        return result, ticks

    with engine:
        result, ticks = asyncio.run(application())
    assert result == 60
    assert ticks > 0


def test_async_wait_raises_like_wait(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[fetches], activities=[fetch], poll_interval=0.01)

    async def application() -> None:
        run_id = await engine.start_workflow_async(fetches, [1])
        with pytest.raises(TimeoutError):
            await engine.wait_async(run_id, timeout=0.05)
        await engine.cancel_async(run_id)
        with pytest.raises(dex.WorkflowCancelledError):
            await engine.wait_async(run_id, timeout=20)

    with engine:
        asyncio.run(application())
