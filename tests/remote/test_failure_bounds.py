"""A remote worker's failure texts are bounded like every failure's (docs/reference/bad-input.md).

A worker's 8 MB ``fail`` message was stored whole, and grew the overview page to 8 MB for
everyone. Now it is kept as its first and last few thousand characters, with a note saying so.
"""

from __future__ import annotations

import pytest

import dex
from dex.domain.values import MAX_FAILURE_TEXT, FailureInfo
from dex.remote import ActivityTaskService
from tests.remote.support import http_server, one, post

EIGHT_MB = 8_000_000  # characters: the body stays under the routes' 8 MiB


def _assert_bounded(failure: FailureInfo | None, length: int, type_length: int) -> None:
    assert failure is not None
    for text, was in ((failure.message, length), (failure.type, type_length)):
        assert len(text) <= MAX_FAILURE_TEXT
        assert f"[truncated: {was:,} characters, kept the first 32,768 and last 4,096]" in text


def test_a_remote_8_mb_fail_over_http_is_stored_truncated(engine: dex.Engine, service: ActivityTaskService) -> None:
    with http_server(service) as base:
        url = f"{base}/v1/activity-tasks"
        run_id = engine.start_workflow(one, "shout", 1, 1)
        status, (task,) = post(f"{url}/poll", {"worker_id": "w1", "names": ["shout"], "wait_seconds": 10})
        error = {"type": "T" * 100_000, "message": "START" + "x" * (EIGHT_MB - 8) + "END", "terminal": True}
        status, _ = post(f"{url}/{task['task_id']}/fail", {"lease_version": task["lease_version"], "error": error})
        assert status == 200
        with pytest.raises(dex.WorkflowFailedError):
            engine.wait(run_id, timeout=10)
        (failed,) = [h.event for h in engine.history(run_id) if h.kind == "ActivityTaskFailed"]
        _assert_bounded(failed.failure, EIGHT_MB, 100_000)
        assert failed.failure.message.startswith("START") and failed.failure.message.endswith("END")
        stored = engine.get_run(run_id).failure
        assert stored is not None
        _assert_bounded(stored.cause, EIGHT_MB, 100_000)  # the run's failure: the activity's, as its cause
        assert len(engine.export_history(run_id)) < 8 * MAX_FAILURE_TEXT

        healthy = engine.start_workflow(one, "echo", "after")
        status, (task,) = post(f"{url}/poll", {"worker_id": "w1", "names": ["echo"], "wait_seconds": 10})
        assert post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": 1}) == (
            200,
            {},
        )
        assert engine.wait(healthy, timeout=10) == 1


def test_a_remote_fail_over_grpc_is_stored_truncated(engine: dex.Engine, service: ActivityTaskService) -> None:
    grpc = pytest.importorskip("grpc")
    from dex.remote.grpc_server import serve_grpc
    from dex.v1 import service_pb2 as pb
    from dex.v1 import service_pb2_grpc as pb_grpc

    length = 1_500_000  # twice this under gRPC's own 4 MB limit of a message
    server = serve_grpc(service, "127.0.0.1", 0)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.ActivityTaskServiceStub(channel)
    try:
        run_id = engine.start_workflow(one, "shout", 1, 1)
        (task,) = stub.Poll(pb.PollRequest(worker_id="g1", names=["shout"], wait_seconds=10), timeout=20).tasks
        error = pb.RemoteError(type="T" * length, message="m" * length, terminal=True)
        stub.Fail(pb.FailRequest(task_id=task.task_id, lease_version=task.lease_version, error=error), timeout=20)
        with pytest.raises(dex.WorkflowFailedError):
            engine.wait(run_id, timeout=10)
        (failed,) = [h.event for h in engine.history(run_id) if h.kind == "ActivityTaskFailed"]
        _assert_bounded(failed.failure, length, length)
        healthy = engine.start_workflow(one, "echo", "after")
        (task,) = stub.Poll(pb.PollRequest(worker_id="g1", names=["echo"], wait_seconds=10), timeout=20).tasks
        stub.Complete(pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json="2"))
        assert engine.wait(healthy, timeout=10) == 2
    finally:
        channel.close()
        server.stop(0)
