"""The remote workers' service on every adapter (docs/reference/contract.md §13): tasks of names no Python process
registers wait for a remote worker, under the retry, lease and timeout rules of Python activities."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService, LeaseLostError, RemoteFailure
from tests.remote.support import one, two


def _poll(service: ActivityTaskService, name: str, wait: float = 10, count: int = 1) -> list[Any]:
    return service.poll("w1", [name], count, wait)


def test_a_task_no_engine_registers_waits_for_a_remote_worker(engine: dex.Engine, service: ActivityTaskService) -> None:
    run_id = engine.start_workflow(one, "resize-image", {"name": "cat.png", "width": 640})
    time.sleep(0.3)  # the engine's rounds go by: it neither runs nor fails the task
    assert engine.get_run(run_id).status is RunStatus.RUNNING
    (task,) = _poll(service, "resize-image")
    assert (task.run_id, task.name, task.attempt, task.args) == (
        run_id,
        "resize-image",
        1,
        ({"name": "cat.png", "width": 640},),
    )
    assert task.heartbeat_timeout == 30.0 and task.lease_version >= 1
    service.complete(task.task_id, task.lease_version, {"width": 320})
    assert engine.wait(run_id, timeout=10) == {"width": 320}


def test_a_long_poll_wakes_when_the_serving_engine_makes_a_task(engine: dex.Engine) -> None:
    service = ActivityTaskService(engine, poll_interval=60)  # only the engine's wake-up can end it early
    got: list[Any] = []
    poller = threading.Thread(target=lambda: got.extend(service.poll("w1", ["echo"], 1, 30)))
    poller.start()
    time.sleep(0.2)
    started = time.monotonic()
    run_id = engine.start_workflow(one, "echo", 7)
    poller.join(20)
    assert not poller.is_alive() and time.monotonic() - started < 10
    (task,) = got
    service.complete(task.task_id, task.lease_version, task.args[0])
    assert engine.wait(run_id, timeout=10) == 7


def test_a_service_over_a_store_finds_work_within_a_poll_interval(engine: dex.Engine) -> None:
    service = ActivityTaskService(engine.store, poll_interval=0.2)  # no engine to wake it
    started = time.monotonic()
    assert service.poll("w1", ["echo"], 1, 0.3) == []
    assert 0.25 <= time.monotonic() - started < 5
    run_id = engine.start_workflow(one, "echo", "x")
    (task,) = _poll(service, "echo")
    service.complete(task.task_id, task.lease_version, "y")
    assert engine.wait(run_id, timeout=10) == "y"


def test_a_failure_is_retried_under_the_policy_then_raised_in_the_workflow(
    engine: dex.Engine, service: ActivityTaskService
) -> None:
    run_id = engine.start_workflow(one, "flaky", None, 2)
    (first,) = _poll(service, "flaky")
    service.fail(first.task_id, first.lease_version, RemoteFailure(type="Timeout", message="upstream slow"))
    (second,) = _poll(service, "flaky")
    assert (second.task_id, second.attempt) == (first.task_id, 2)
    service.fail(second.task_id, second.lease_version, RemoteFailure(type="Timeout", message="still slow"))
    with pytest.raises(dex.WorkflowFailedError) as raised:
        engine.wait(run_id, timeout=10)
    assert "still slow" in str(raised.value)


def test_a_terminal_failure_is_not_retried(engine: dex.Engine, service: ActivityTaskService) -> None:
    run_id = engine.start_workflow(one, "strict", None, 5)
    (task,) = _poll(service, "strict")
    service.fail(task.task_id, task.lease_version, RemoteFailure(type="Invalid", message="bad image", terminal=True))
    with pytest.raises(dex.WorkflowFailedError, match="bad image"):
        engine.wait(run_id, timeout=10)


def test_calls_on_a_lost_lease_are_refused_and_change_nothing(engine: dex.Engine) -> None:
    service = ActivityTaskService(engine, lease=timedelta(seconds=0.5))
    run_id = engine.start_workflow(one, "echo", 1)
    (first,) = _poll(service, "echo")
    with pytest.raises(LeaseLostError):
        service.complete(first.task_id, first.lease_version + 1, "wrong version")
    time.sleep(0.7)  # the lease lapses
    for call in (
        lambda: service.complete(first.task_id, first.lease_version, "late"),
        lambda: service.fail(first.task_id, first.lease_version, RemoteFailure(type="E", message="late")),
        lambda: service.heartbeat(first.task_id, first.lease_version),
    ):
        with pytest.raises(LeaseLostError):
            call()
    (second,) = service.poll("w2", ["echo"], 1, 10)
    assert (second.task_id, second.attempt) == (first.task_id, 2)
    assert second.lease_version != first.lease_version  # each claim its own token
    with pytest.raises(LeaseLostError):
        service.complete(first.task_id, first.lease_version, "old holder")
    service.complete(second.task_id, second.lease_version, "new holder")
    with pytest.raises(LeaseLostError):
        service.complete(second.task_id, second.lease_version, "twice")
    assert engine.wait(run_id, timeout=10) == "new holder"


def test_a_heartbeat_answers_cancel_requested_once_the_run_is_cancelled(
    engine: dex.Engine, service: ActivityTaskService
) -> None:
    run_id = engine.start_workflow(one, "slow", 1)
    (task,) = _poll(service, "slow")
    assert service.heartbeat(task.task_id, task.lease_version) is False
    engine.cancel(run_id)
    deadline = time.monotonic() + 5
    while not service.heartbeat(task.task_id, task.lease_version):
        assert time.monotonic() < deadline, "the heartbeat never said cancel_requested"
        time.sleep(0.05)
    with pytest.raises(LeaseLostError):
        service.complete(task.task_id, task.lease_version, "after the cancel")
    assert engine.get_run(run_id).status is RunStatus.CANCELLED


def test_arguments_with_no_json_form_fail_that_task_only(engine: dex.Engine, service: ActivityTaskService) -> None:
    bad = engine.start_workflow(one, "echo", b"\x00raw bytes")
    good = engine.start_workflow(two, "a", "b")
    time.sleep(0.3)
    tasks = service.poll("w1", ["echo"], 10, 10)
    assert sorted(task.args[0] for task in tasks) == ["a", "b"]
    with pytest.raises(dex.WorkflowFailedError, match="no JSON form"):
        engine.wait(bad, timeout=10)
    for task in tasks:
        service.complete(task.task_id, task.lease_version, task.args[0].upper())
    assert engine.wait(good, timeout=10) == ["A", "B"]


@dex.activity(name="local-double")
def local_double(x: int) -> int:
    return x * 2


@dex.workflow(name="remote-mixed")
async def mixed(ctx: dex.WorkflowContext, x: int) -> list[Any]:
    """A Python activity and a remote one on the same queue, at once."""
    return list(await ctx.gather(ctx.activity(local_double, x), ctx.activity("remote-triple", x)))


def test_an_engine_runs_its_own_activities_and_leaves_the_others_alone(store_factory: Any) -> None:
    with dex.Engine(store_factory(), workflows=[mixed], activities=[local_double], poll_interval=0.02) as engine:
        service = ActivityTaskService(engine)
        run_id = engine.start_workflow(mixed, 5)
        time.sleep(0.5)  # the local activity ran; the engine's rounds pass the remote task by
        assert engine.get_run(run_id).status is RunStatus.RUNNING
        (task,) = service.poll("w1", ["remote-triple"], 5, 10)
        assert (task.attempt, task.args) == (1, (5,))
        service.complete(task.task_id, task.lease_version, 15)
        assert engine.wait(run_id, timeout=10) == [10, 15]
