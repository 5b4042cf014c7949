"""Long polls never starve the other calls (issue: remote long polls starved the API).

Long polls ran in the web app's one thread pool (anyio's 40 threads): with 40 idle workers
polling, ``GET /v1/runs`` waited for a poll to end, and a worker's ``complete`` came after its
lease and failed its run. Now an HTTP poll waits as a coroutine, a gRPC poll on a thread the
server keeps for it, at most ``long_poll_limit`` at once (one more is refused at once, 503 with
``Retry-After`` / ``UNAVAILABLE``), and ``engine.health()`` reports them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

import dex
from dex.adapters.observability.prometheus import PrometheusTelemetry
from dex.remote import ActivityTaskService, PollLimitError
from dex.web import create_app
from tests.remote.support import app_server, call, one, post

LIMIT = 45  # more than anyio's 40 threads: the polls alone held the whole pool before


def _until(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_with_the_limit_of_long_polls_open_the_api_and_a_complete_still_answer(engine: dex.Engine) -> None:
    metrics = PrometheusTelemetry()
    engine.telemetry.attach(metrics)
    service = ActivityTaskService(engine, long_poll_limit=LIMIT)
    assert (engine.health().long_polls_open, engine.health().long_polls_limit) == (0, LIMIT)
    assert metrics.registry.get_sample_value("dex_long_polls_limit") == LIMIT
    with app_server(create_app(engine, activity_task_service=service)) as base:
        poll = f"{base}/v1/activity-tasks/poll"
        run_id = engine.start_workflow(one, "echo", "held")
        status, (task,) = post(poll, {"worker_id": "busy", "names": ["echo"], "wait_seconds": 10})
        assert status == 200
        with ThreadPoolExecutor(LIMIT) as clients:
            idle: list[Future[tuple[int, Any]]] = [
                clients.submit(
                    post, poll, {"worker_id": f"idle-{i}", "names": ["idle"], "wait_seconds": 60}, timeout=90
                )
                for i in range(LIMIT)
            ]
            _until(lambda: engine.health().long_polls_open == LIMIT, "the idle polls did not all open")
            assert not engine.health().ok  # saturated: something to look at
            assert metrics.registry.get_sample_value("dex_long_polls_open") == LIMIT

            # one poll more is refused at once, claiming nothing, with a time to come back
            status, answer, headers = call(poll, {"worker_id": "late", "names": ["echo"], "wait_seconds": 5})
            assert (status, answer["error"]["type"], headers.get("retry-after")) == (503, "Unavailable", "1")
            # a poll that does not wait is a short call: it is served
            assert post(poll, {"worker_id": "quick", "names": ["nothing"], "wait_seconds": 0}) == (200, [])

            # the API answers, and the held task's complete is recorded
            status, runs, _ = call(f"{base}/v1/runs", method="GET", timeout=20)
            assert status == 200 and run_id in [run["run_id"] for run in runs["runs"]]
            completed = post(
                f"{base}/v1/activity-tasks/{task['task_id']}/complete",
                {
                    "lease_version": task["lease_version"],
                    "result": "done",
                },
                timeout=20,
            )
            assert completed == (200, {})
            assert engine.wait(run_id, timeout=20) == "done"

            # work for the idle polls: each gets a task, which it completes
            runs_for_idle = [engine.start_workflow(one, "idle", i) for i in range(LIMIT)]
            for future in idle:
                status, tasks = future.result(timeout=60)
                assert status == 200 and len(tasks) == 1
                (claimed,) = tasks
                assert post(
                    f"{base}/v1/activity-tasks/{claimed['task_id']}/complete",
                    {
                        "lease_version": claimed["lease_version"],
                        "result": claimed["args"][0],
                    },
                ) == (200, {})
            assert sorted(engine.wait(r, timeout=20) for r in runs_for_idle) == list(range(LIMIT))
        _until(lambda: engine.health().long_polls_open == 0, "the polls' places were not given back")
        assert metrics.registry.get_sample_value("dex_long_polls_open") == 0

        # a healthy run after
        healthy = engine.start_workflow(one, "echo", "after")
        status, (task,) = post(poll, {"worker_id": "late", "names": ["echo"], "wait_seconds": 10})
        post(
            f"{base}/v1/activity-tasks/{task['task_id']}/complete",
            {"lease_version": task["lease_version"], "result": 1},
        )
        assert engine.wait(healthy, timeout=20) == 1


def test_a_blocking_poll_past_the_limit_is_refused_and_gives_its_place_back(engine: dex.Engine) -> None:
    service = ActivityTaskService(engine, long_poll_limit=2, poll_interval=0.05)
    with ThreadPoolExecutor(2) as threads:
        waiting = [threads.submit(service.poll, f"w{i}", ["idle"], 1, 30) for i in range(2)]
        _until(lambda: service.long_polls.open == 2, "the polls did not open")
        with pytest.raises(PollLimitError) as refused:
            service.poll("w3", ["idle"], 1, 1)
        assert refused.value.status == 503 and refused.value.retry_after == 1
        assert service.poll("w3", ["idle"], 1, 0) == []  # not a long poll: served
        runs = [engine.start_workflow(one, "idle", i) for i in range(2)]
        for future in waiting:
            (task,) = future.result(timeout=30)
            service.complete(task.task_id, task.lease_version, task.args[0])
        assert sorted(engine.wait(r, timeout=20) for r in runs) == [0, 1]
    assert service.long_polls.open == 0
    healthy = engine.start_workflow(one, "echo", "ok")
    (task,) = service.poll("w1", ["echo"], 1, 10)
    service.complete(task.task_id, task.lease_version, "ok")
    assert engine.wait(healthy, timeout=20) == "ok"


def test_the_limit_must_be_a_positive_integer(engine: dex.Engine) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="long-poll limit"):
            ActivityTaskService(engine, long_poll_limit=bad)  # type: ignore[arg-type]


def test_grpc_polls_at_the_limit_leave_threads_for_the_other_calls(engine: dex.Engine) -> None:
    grpc = pytest.importorskip("grpc")
    from dex.remote.grpc_server import serve_grpc
    from dex.v1 import service_pb2 as pb
    from dex.v1 import service_pb2_grpc as pb_grpc

    service = ActivityTaskService(engine, long_poll_limit=4)
    server = serve_grpc(service, "127.0.0.1", 0, max_workers=2)  # two threads for the calls, four for polls
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.ActivityTaskServiceStub(channel)
    try:
        run_id = engine.start_workflow(one, "echo", "held")
        (task,) = stub.Poll(pb.PollRequest(worker_id="busy", names=["echo"], wait_seconds=10), timeout=20).tasks
        with ThreadPoolExecutor(4) as clients:
            idle = [
                clients.submit(
                    stub.Poll, pb.PollRequest(worker_id=f"i{i}", names=["idle"], wait_seconds=60), timeout=90
                )
                for i in range(4)
            ]
            _until(lambda: engine.health().long_polls_open == 4, "the idle polls did not all open")
            with pytest.raises(grpc.RpcError) as refused:
                stub.Poll(pb.PollRequest(worker_id="late", names=["echo"], wait_seconds=5), timeout=20)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert ("grpc-retry-pushback-ms", "1000") in tuple(refused.value.trailing_metadata())
            # the calls still have their threads
            beat = stub.Heartbeat(
                pb.HeartbeatRequest(task_id=task.task_id, lease_version=task.lease_version), timeout=20
            )
            assert beat.cancel_requested is False
            stub.Complete(
                pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json='"done"'),
                timeout=20,
            )
            assert engine.wait(run_id, timeout=20) == "done"
            runs = [engine.start_workflow(one, "idle", i) for i in range(4)]
            for future in idle:
                (claimed,) = future.result(timeout=60).tasks
                stub.Complete(
                    pb.CompleteRequest(task_id=claimed.task_id, lease_version=claimed.lease_version, result_json="0"),
                    timeout=20,
                )
            assert [engine.wait(r, timeout=20) for r in runs] == [0, 0, 0, 0]
        assert engine.health().long_polls_open == 0
    finally:
        channel.close()
        server.stop(0)
