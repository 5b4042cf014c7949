"""The standard workload plus transaction steps (``@dex.transaction``), whose exactly-once
writes the simulation can check.

``sim-ledger`` runs three ``sim-book`` steps one after the other. Each step writes a key to its
transaction's connection — the world's :class:`~dex.simulation.workload.LedgerConnection`, which
the in-memory adapter commits with the step's outcome or rolls back — and then may fail as any
simulated activity does (after its write: the write must then be rolled back). With
``inline=True`` the nodes run first attempts in groups inside their workflow tasks
(:mod:`dex.app.workflows.step_groups`), retries and the rest as tasks of their own.

:func:`ledger_violations` is the check: no key committed twice, and every step a run's history
records as completed committed exactly once.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import dex
from dex.app.ports.store import RunRecord
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.simulation.workload import ACTIVITIES, FAST_RETRY, WORKFLOW_BY_NAME, WORKFLOWS, Workload, current_world

BOOK = "sim-book"


@dex.transaction(name=BOOK, retry=FAST_RETRY)
def book(conn: Any, key: str) -> str:
    conn.write(f"{dex.activity_context().run_id}:{key}")
    current_world().perform(BOOK, (key,))
    return f"booked:{key}"


@dex.workflow(name="sim-ledger")
async def ledger(ctx: dex.WorkflowContext, key: str) -> list[str]:
    return [await ctx.activity(book, f"{key}-{n}") for n in range(3)]


class TransactionWorkload(Workload):
    """The standard workload, and ``sim-ledger`` runs for two starts in five."""

    workflows = (*WORKFLOWS, ledger)
    activities = (*ACTIVITIES, book)

    def workflow(self, name: str) -> Callable[..., Any]:
        return ledger if name == "sim-ledger" else WORKFLOW_BY_NAME[name]

    def activity_result(self, name: str, args: list[Any]) -> Any:
        return f"booked:{args[0]}" if name == BOOK else super().activity_result(name, args)

    def start(self, engine: dex.Engine, rng: random.Random, serial: int) -> str:
        if rng.random() < 0.4:
            return engine.start_workflow(ledger, f"l{serial}")
        return super().start(engine, rng, serial)

    def check_outcome(self, record: RunRecord, inputs: list[Any], result: Any) -> str | None:
        if record.workflow_name != "sim-ledger":
            return super().check_outcome(record, inputs, result)
        if record.status is RunStatus.FAILED:
            assert record.failure is not None
            return None if record.failure.type == "ActivityFailedError" else f"failed with {record.failure.type}"
        if record.status is RunStatus.COMPLETED:
            (key,) = inputs
            expected = [f"booked:{key}-{n}" for n in range(3)]
            return None if result == expected else f"expected {expected!r}, got {result!r}"
        return None


def ledger_violations(committed: dict[str, int], histories: dict[str, list[ev.HistoryEvent]]) -> list[str]:
    """What breaks exactly-once: a key committed more than once, or a step recorded as completed
    whose write was not committed (``histories``: every run's, by id)."""
    wrong = [f"{key} committed {n} times" for key, n in sorted(committed.items()) if n > 1]
    for run_id, history in sorted(histories.items()):
        steps = {e.sequence_number: e.event for e in history if isinstance(e.event, ev.ActivityTaskCreated)}
        for item in history:
            event = item.event
            if isinstance(event, ev.ActivityTaskCompleted) and steps[event.created_seq].name == BOOK:
                key = current_key(steps[event.created_seq])
                if committed.get(f"{run_id}:{key}", 0) != 1:
                    wrong.append(
                        f"run {run_id}: step {key} completed, its write committed {committed.get(f'{run_id}:{key}', 0)} times"
                    )
    return wrong


def current_key(created: ev.ActivityTaskCreated) -> str:
    """The key a ``sim-book`` step was called with (its one argument, JSON)."""
    import json

    return str(json.loads(created.input[0].data))
