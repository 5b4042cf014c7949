"""A failure of the engine's machinery fails the workflow task, never the run (docs/reference/contract.md §8), on
every adapter, path by path: the store failing an inline activity's look at its queue, the
load of a task, the claim of a round; and a bug of dex while deciding. Each asserts both
sides: the run is not FAILED (its task is given back and retried), and it — and a healthy run
started afterwards — complete once the machinery works again.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

import dex
import dex.app.workflows.worker
from dex.app.ports.store import ActivitySlots
from dex.app.runtime.options import RuntimeOptions
from dex.testing import VirtualClock

LEASE = timedelta(seconds=30)
ran: list[int] = []


@dex.activity
def bump(x: int) -> int:
    ran.append(x)
    return x + 1


@dex.workflow
async def bumped_twice(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(bump, x)
    return await ctx.activity(bump, x)  # type: ignore[no-any-return]


def _claim_one(engine: dex.Engine, clock: VirtualClock, owner: str = "probe") -> Any:
    tasks = engine.store.claim_workflow_tasks(frozenset({"bumped_twice"}), owner, clock.now(), LEASE, 10)
    return tasks


def test_a_store_error_while_an_inline_activity_looks_at_its_queue_fails_no_run(
    adapter_factory: Any, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: 'connection lost during list_queues' failed the run."""
    adapter = adapter_factory()
    reads = {"fail": True}
    slots = adapter.activity_slots

    def read_queues() -> list[ActivitySlots]:
        if reads["fail"]:
            raise ConnectionError("connection lost during list_queues")
        return list(slots())

    monkeypatch.setattr(adapter, "activity_slots", read_queues)
    # drain runs first attempts inline as a started engine does (the runtime's options)
    options = RuntimeOptions(drain_inline=60.0, slots_ttl=0)
    engine = dex.Engine(adapter, workflows=[bumped_twice], activities=[bump], runtime_options=options)
    engine.activity_worker.durations.record("bump", 0.001)
    ran.clear()
    run_id = engine.start_workflow(bumped_twice, 1)
    engine.drain()  # every queue read fails: the activities take the ordinary path
    assert engine.wait(run_id, timeout=5) == 3
    assert ran == [1, 2]
    reads["fail"] = False  # the store is back: activities run inline again
    healthy = engine.start_workflow(bumped_twice, 10)
    engine.drain()
    assert engine.wait(healthy, timeout=5) == 12
    engine.stop(timeout=5)


def test_a_bug_of_dex_while_deciding_fails_the_task_not_the_run(
    make_engine: Any, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A deterministic bug recurs on every attempt: each is logged with the run id and retried
    with a growing backoff (at most 5 minutes); the run waits, never FAILED by it."""
    engine = make_engine([bumped_twice], [bump])
    run_id = engine.start_workflow(bumped_twice, 1)
    real_advance = dex.app.workflows.worker.advance

    def buggy(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug of dex")

    monkeypatch.setattr(dex.app.workflows.worker, "advance", buggy)
    engine.workflow_scheduler.step()
    waits = []
    with caplog.at_level(logging.WARNING, logger="dex.worker"):
        for _ in range(3):
            (task,) = _claim_one(engine, clock, engine.node_id)
            assert engine.workflow_worker.execute(task) is None  # nothing to write: given back
            assert engine.get_run(run_id).status is not dex.RunStatus.FAILED
            given_back_at = clock.now()
            while not (again := _claim_one(engine, clock)):
                clock.advance(timedelta(milliseconds=250))
            waits.append((clock.now() - given_back_at).total_seconds())
            engine.store.retry_workflow_tasks([(again[0], clock.now())], clock.now())  # the probe lets go
    assert waits[0] < waits[1] < waits[2] <= 300
    logged = [r for r in caplog.records if "a bug of dex" in r.getMessage()]
    assert len(logged) == 3 and all(getattr(r, "run_id", None) == run_id for r in logged)
    assert all(r.exc_info for r in logged)  # a bug is logged with its traceback, every time
    monkeypatch.setattr(dex.app.workflows.worker, "advance", real_advance)  # the bug is fixed
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 3
    healthy = engine.start_workflow(bumped_twice, 5)
    engine.drain()
    assert engine.wait(healthy, timeout=5) == 7


class _FailingLoads:
    def __init__(self, engine: dex.Engine) -> None:
        self.store = engine.store
        self.real = engine.store.load_workflow_tasks
        self.failures = 0

    def __call__(self, requests: Any, now: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("connection lost during load_workflow_tasks")
        return self.real(requests, now)


def test_a_failed_load_gives_the_round_back_and_fails_no_run(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([bumped_twice], [bump])
    run_ids = [engine.start_workflow(bumped_twice, i) for i in range(3)]
    engine.workflow_scheduler.step()
    loads = _FailingLoads(engine)
    engine.store.load_workflow_tasks = loads  # type: ignore[method-assign]
    loads.failures = 1
    assert engine.workflow_worker.poll_once() == 3  # the round ends without raising
    assert len(engine.buffer) == 0
    assert _claim_one(engine, clock) == []  # given back, claimable after a backoff
    assert {engine.get_run(r).status for r in run_ids} == {dex.RunStatus.CREATED}  # not FAILED
    engine.drain()
    assert [engine.wait(r, timeout=5) for r in run_ids] == [2, 3, 4]


def test_a_failed_claim_keeps_the_tasks_handed_to_the_worker(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([bumped_twice], [bump])
    run_id = engine.start_workflow(bumped_twice, 1)
    engine.workflow_scheduler.step()
    worker = engine.workflow_worker
    worker.hand(_claim_one(engine, clock, engine.node_id))
    real_claim = engine.store.claim_workflow_tasks

    def failing_claim(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("connection lost during claim_workflow_tasks")

    engine.store.claim_workflow_tasks = failing_claim  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):  # the polling thread backs off
        worker.poll_once()
    assert worker.backlog() == 1  # the handed task is still ours
    engine.store.claim_workflow_tasks = real_claim  # type: ignore[method-assign]
    assert worker.poll_once(claim=False) == 1
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 3
