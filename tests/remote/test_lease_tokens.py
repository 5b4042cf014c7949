"""A task's calls are bound to the worker that claimed it (issue: any worker could complete
another's task).

``complete``/``fail``/``heartbeat`` named a task by its id and ``lease_version``, a counter (1 on
the first claim), and ignored ``worker_id``: a worker that never polled completed another's task
and set the run's result. Now ``lease_version`` is a random token of the claim (a JSON integer
below 2**53), and a ``worker_id`` sent with a call must be the claimer's.
"""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService, LeaseLostError, RemoteFailure
from tests.remote.support import http_server, one, post


def _forgeries(task: Any) -> list[tuple[int, str | None]]:
    """(lease_version, worker_id) pairs a worker that never polled the task might send."""
    token = task.lease_version
    return [(1, None), (2, None), (token + 1, None), (token - 1, None), (1, "w1"), (token + 1, "w1"), (token, "w2")]


def test_a_worker_that_never_polled_cannot_complete_fail_or_heartbeat_anothers_task(
    engine: dex.Engine, service: ActivityTaskService
) -> None:
    run_id = engine.start_workflow(one, "echo", "mine", 1)
    (task,) = service.poll("w1", ["echo"], 1, 10)
    assert isinstance(task.lease_version, int) and 1 <= task.lease_version < 2**53
    forged_failure = RemoteFailure(type="E", message="forged", terminal=True)
    for version, worker in _forgeries(task):
        with pytest.raises(LeaseLostError):
            service.complete(task.task_id, version, "forged", worker)
        with pytest.raises(LeaseLostError):
            service.fail(task.task_id, version, forged_failure, worker)
        with pytest.raises(LeaseLostError):
            service.heartbeat(task.task_id, version, worker)
    # nothing changed: the run waits for the claimer, whose lease still holds
    assert engine.get_run(run_id).status is RunStatus.RUNNING
    assert not [h for h in engine.history(run_id) if h.kind in ("ActivityTaskCompleted", "ActivityTaskFailed")]
    assert service.heartbeat(task.task_id, task.lease_version) is False
    assert service.heartbeat(task.task_id, task.lease_version, "w1") is False  # naming itself
    service.complete(task.task_id, task.lease_version, "mine", "w1")
    assert engine.wait(run_id, timeout=10) == "mine"
    healthy = engine.start_workflow(one, "echo", "after")
    (task,) = service.poll("w2", ["echo"], 1, 10)
    service.complete(task.task_id, task.lease_version, "after")
    assert engine.wait(healthy, timeout=10) == "after"


def test_another_workers_own_valid_token_does_not_hold_this_task(
    engine: dex.Engine, service: ActivityTaskService
) -> None:
    first = engine.start_workflow(one, "echo", "first", 1)
    second = engine.start_workflow(one, "echo", "second", 1)
    (mine,) = service.poll("w1", ["echo"], 1, 10)
    (theirs,) = service.poll("w2", ["echo"], 1, 10)
    assert mine.lease_version != theirs.lease_version
    with pytest.raises(LeaseLostError):
        service.complete(mine.task_id, theirs.lease_version, "taken")
    with pytest.raises(LeaseLostError):
        service.complete(mine.task_id, theirs.lease_version, "taken", "w2")
    service.complete(theirs.task_id, theirs.lease_version, "theirs", "w2")
    service.complete(mine.task_id, mine.lease_version, "mine")
    results = {engine.wait(first, timeout=10), engine.wait(second, timeout=10)}
    assert results == {"mine", "theirs"}


def test_over_http_a_forged_complete_is_409_and_the_claimer_completes(
    engine: dex.Engine, service: ActivityTaskService
) -> None:
    with http_server(service) as base:
        url = f"{base}/v1/activity-tasks"
        run_id = engine.start_workflow(one, "echo", "mine", 1)
        status, (task,) = post(f"{url}/poll", {"worker_id": "w1", "names": ["echo"], "wait_seconds": 10})
        assert status == 200 and 1 <= task["lease_version"] < 2**53
        path = f"{url}/{task['task_id']}"
        for version, worker in [(1, None), (task["lease_version"] + 1, None), (task["lease_version"], "w2")]:
            extra = {} if worker is None else {"worker_id": worker}
            for name, body in (
                ("complete", {"result": "forged"}),
                ("fail", {"error": {"type": "E", "message": "forged", "terminal": True}}),
                ("heartbeat", {}),
            ):
                status, answer = post(f"{path}/{name}", {"lease_version": version, **body, **extra})
                assert (status, answer["error"]["type"]) == (409, "LeaseLost"), (name, version, worker)
        assert post(f"{path}/heartbeat", {"lease_version": task["lease_version"], "worker_id": "w1"}) == (
            200,
            {"cancel_requested": False},
        )
        assert engine.get_run(run_id).status is RunStatus.RUNNING
        assert post(f"{path}/complete", {"lease_version": task["lease_version"], "result": "mine"}) == (200, {})
        assert engine.wait(run_id, timeout=10) == "mine"
        status, answer = post(f"{path}/complete", {"lease_version": task["lease_version"], "result": 1, "worker_id": 5})
        assert status == 400  # a worker_id that is not a string
