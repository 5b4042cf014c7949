"""Giving a claimed workflow task back for a later retry (``retry_workflow_tasks``), on every adapter."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex

LEASE = timedelta(seconds=30)


@dex.workflow
async def idle(ctx: dex.WorkflowContext) -> int:
    return 1


def test_a_task_given_back_is_claimable_again_only_from_its_retry_time(make_engine: Any) -> None:
    engine = make_engine([idle], [])
    store, names = engine.store, frozenset({"idle"})
    run_id = engine.start_workflow(idle)
    engine.workflow_scheduler.step()
    (task,) = store.claim_workflow_tasks(names, "a", store.clock.now(), LEASE, 10)
    result = engine.workflow_worker.execute(task)
    retry_at = store.clock.now() + timedelta(seconds=5)

    assert store.retry_workflow_tasks([(task, retry_at)], store.clock.now()) == [True]
    assert store.retry_workflow_tasks([(task, retry_at)], store.clock.now()) == [False]  # the version moved on
    assert store.claim_workflow_tasks(names, "b", store.clock.now(), LEASE, 10) == []  # not before retry_at
    # a late result of the given-back claim is discarded
    assert store.complete_workflow_tasks([(task, result)], store.clock.now()) == [False]

    store.clock.advance(timedelta(seconds=5))
    (again,) = store.claim_workflow_tasks(names, "b", store.clock.now(), LEASE, 10)
    assert (again.run_id, again.task_id) == (run_id, task.task_id)
    assert again.lease.version > task.lease.version + 1
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 1


def test_retry_later_gives_the_task_back_with_a_growing_backoff(make_engine: Any) -> None:
    engine = make_engine([idle], [])
    store, names, worker = engine.store, frozenset({"idle"}), engine.workflow_worker
    run_id = engine.start_workflow(idle)
    engine.workflow_scheduler.step()
    waits = []
    for _ in range(3):
        (task,) = store.claim_workflow_tasks(names, engine.node_id, store.clock.now(), LEASE, 10)
        assert worker.retry_later(task, "a test says so")
        given_back_at = store.clock.now()
        while not (again := store.claim_workflow_tasks(names, "probe", store.clock.now(), LEASE, 10)):
            store.clock.advance(timedelta(milliseconds=100))
        waits.append((store.clock.now() - given_back_at).total_seconds())
        store.retry_workflow_tasks([(again[0], store.clock.now())], store.clock.now())  # the probe lets go
    assert 0.6 <= waits[0] <= 1.4
    assert waits[0] < waits[1] < waits[2] <= 300
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 1
