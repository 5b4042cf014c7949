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
