"""The standard workload plus runs of consecutive activities, for chained steps
(``Simulator(chained=True)``, ``Engine(chained_activity_seconds=...)``).

``sim-pipeline`` calls ``sim-charge``, ``sim-square`` and ``sim-crunch`` one after the other,
with nothing between them: with ``chained=True`` the first is a task, and a step answered after
it runs the next ones in the attempt's thread, so a crash, a lost claim, a declined write, a
suspend or a cancel can come between a chained attempt and the write that records it. Clients
may suspend and cancel these runs as any other; each activity may fail and be retried as any
simulated one does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import dex
from dex.app.ports.store import RunRecord
from dex.domain.status import RunStatus
from dex.simulation.workload import RESULTS, WORKFLOW_BY_NAME, WORKFLOWS, Workload, charge, crunch, square

PIPELINE = "sim-pipeline"


@dex.workflow(name=PIPELINE)
async def pipeline(ctx: dex.WorkflowContext, order_id: str, x: int) -> list[Any]:
    receipt: str = await ctx.activity(charge, order_id, x)
    squared: int = await ctx.activity(square, x)
    crunched: int = await ctx.activity(crunch, x)
    return [receipt, squared, crunched]


class ChainWorkload(Workload):
    """The standard workload, and ``sim-pipeline`` runs for half the starts."""

    workflows = (*WORKFLOWS, pipeline)

    def workflow(self, name: str) -> Callable[..., Any]:
        return pipeline if name == PIPELINE else WORKFLOW_BY_NAME[name]

    def start(self, engine: dex.Engine, rng: random.Random, serial: int) -> str:
        if rng.random() < 0.5:
            return engine.start_workflow(pipeline, f"p{serial}", rng.randint(0, 9))
        return super().start(engine, rng, serial)

    def check_outcome(self, record: RunRecord, inputs: list[Any], result: Any) -> str | None:
        if record.workflow_name != PIPELINE:
            return super().check_outcome(record, inputs, result)
        if record.status is RunStatus.FAILED:
            assert record.failure is not None
            return None if record.failure.type == "ActivityFailedError" else f"failed with {record.failure.type}"
        if record.status is RunStatus.COMPLETED:
            order_id, x = inputs
            expected = [RESULTS["sim-charge"](order_id, x), RESULTS["sim-square"](x), RESULTS["sim-crunch"](x)]
            return None if result == expected else f"expected {expected!r}, got {result!r}"
        return None


CHAIN_WORKLOAD = ChainWorkload()
