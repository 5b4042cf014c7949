"""The write buffer keeps what a failed flush could not write and sends it again."""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock


class FlakyStore(InMemoryAdapter):
    """Refuses the next ``failures`` batch writes, as a database that is restarting would."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.failures = 0

    def complete_workflow_tasks(self, results: Any, now: Any) -> list[bool]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return super().complete_workflow_tasks(results, now)


@dex.workflow
async def short(ctx: dex.WorkflowContext) -> str:
    await ctx.sleep(1)
    return "done"


def test_a_failed_flush_is_sent_again_and_nothing_is_lost() -> None:
    store = FlakyStore()
    engine = dex.Engine(store, workflows=[short])
    run_id = engine.start_workflow(short)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.failures = 1
    with pytest.raises(ConnectionError):
        engine.buffer.flush()
    assert len(engine.buffer) == 1  # kept, not dropped
    assert engine.buffer.flush() == 1
    assert engine.buffer.discarded == 0
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "done"


def test_stop_survives_a_store_that_refuses_the_final_flush() -> None:
    store = FlakyStore()
    engine = dex.Engine(store, workflows=[short])
    engine.start_workflow(short)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.failures = 10
    engine.stop(timeout=1)  # logs, releases what it can, does not raise
    assert len(engine.buffer) == 1
