"""The gRPC mirror of the remote workers' API (docs/reference/contract.md §13), through a real channel: the same
operations and errors as HTTP, served by the same service."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

import dex  # noqa: E402
from dex.remote import ActivityTaskService  # noqa: E402
from dex.remote.grpc_server import serve_grpc  # noqa: E402
from dex.v1 import service_pb2 as pb  # noqa: E402
from dex.v1 import service_pb2_grpc as pb_grpc  # noqa: E402
from tests.remote.support import one  # noqa: E402


@pytest.fixture
def stub(service: ActivityTaskService) -> Iterator[Any]:
    server = serve_grpc(service, "127.0.0.1", 0)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield pb_grpc.ActivityTaskServiceStub(channel)
    finally:
        channel.close()
        server.stop(0)


def _poll(stub: Any, name: str = "echo") -> Any:
    (task,) = stub.Poll(pb.PollRequest(worker_id="g1", names=[name], max=1, wait_seconds=10), timeout=20).tasks
    return task


def test_a_grpc_worker_completes_a_run(engine: dex.Engine, stub: Any) -> None:
    run_id = engine.start_workflow(one, "echo", {"big": 2**62 + 1})
    task = _poll(stub)
    assert (task.run_id, task.name, task.attempt, json.loads(task.args_json)) == (
        run_id,
        "echo",
        1,
        [{"big": 2**62 + 1}],
    )
    until = task.lease_until.ToDatetime(tzinfo=UTC)
    assert abs(until - (datetime.now(UTC) + timedelta(seconds=task.heartbeat_timeout))) < timedelta(seconds=5)
    beat = stub.Heartbeat(pb.HeartbeatRequest(task_id=task.task_id, lease_version=task.lease_version))
    assert beat.cancel_requested is False
    stub.Complete(pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json='"done"'))
    assert engine.wait(run_id, timeout=10) == "done"
    with pytest.raises(grpc.RpcError) as lost:
        stub.Complete(pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json="1"))
    assert lost.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert lost.value.details().startswith("LeaseLost:")


def test_a_grpc_failure_is_retried_then_terminal(engine: dex.Engine, stub: Any) -> None:
    run_id = engine.start_workflow(one, "echo", 1, 3)
    task = _poll(stub)
    error = pb.RemoteError(type="Busy", message="later", retry_after_seconds=0.1)
    stub.Fail(pb.FailRequest(task_id=task.task_id, lease_version=task.lease_version, error=error))
    again = _poll(stub)
    assert (again.task_id, again.attempt) == (task.task_id, 2)
    error = pb.RemoteError(type="Broken", message="for good \x00", terminal=True)
    stub.Fail(pb.FailRequest(task_id=again.task_id, lease_version=again.lease_version, error=error))
    with pytest.raises(dex.WorkflowFailedError, match="for good"):
        engine.wait(run_id, timeout=10)


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda s: s.Poll(pb.PollRequest(worker_id="g\x00", names=["echo"])), "INVALID_ARGUMENT"),
        (lambda s: s.Poll(pb.PollRequest(worker_id="g", names=[])), "INVALID_ARGUMENT"),
        (lambda s: s.Complete(pb.CompleteRequest(task_id=0, lease_version=1, result_json="1")), "NOT_FOUND"),
        (lambda s: s.Complete(pb.CompleteRequest(task_id=5, lease_version=1, result_json="nope")), "INVALID_ARGUMENT"),
        (lambda s: s.Complete(pb.CompleteRequest(task_id=5, lease_version=1, result_json="NaN")), "INVALID_ARGUMENT"),
        (lambda s: s.Heartbeat(pb.HeartbeatRequest(task_id=10**12, lease_version=1)), "FAILED_PRECONDITION"),
        (lambda s: s.Fail(pb.FailRequest(task_id=5, lease_version=1)), "INVALID_ARGUMENT"),
    ],
)
def test_refused_grpc_calls_get_their_status_code(engine: dex.Engine, stub: Any, call: Any, code: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        call(stub)
    assert refused.value.code() is getattr(grpc.StatusCode, code)
    run_id = engine.start_workflow(one, "echo", 2)  # and a healthy run completes
    task = _poll(stub)
    stub.Complete(pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json="3"))
    assert engine.wait(run_id, timeout=10) == 3
