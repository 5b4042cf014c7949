"""The remote workers' gRPC API (docs/reference/contract.md §13): ``dex.v1.ActivityTaskService`` over the same
:class:`~dex.remote.service.ActivityTaskService` as the HTTP routes.

``serve_grpc(service, host, port)`` starts a ``grpc.server`` (the ``grpc`` extra: grpcio) and
returns it; ``server.stop(grace)`` ends it. Arguments and results cross as JSON text; a refused
call ends with a status code (``INVALID_ARGUMENT`` for HTTP's 400 and 422, ``NOT_FOUND``,
``FAILED_PRECONDITION`` for a lost lease (409), ``UNAVAILABLE`` when the store failed) and the
error's message as its details. Each call runs on one of the server's threads, a long poll
included; the server keeps ``max_workers`` threads for the calls and one more for each long poll
the service lets wait (its ``long_poll_limit``, shared with HTTP), so waiting polls never hold
the threads a ``Complete`` or ``Heartbeat`` needs. A poll past that limit ends at once with
``UNAVAILABLE`` and the trailing metadata ``grpc-retry-pushback-ms`` (gRPC's retry hint).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from dex.remote.errors import InvalidValueError, RemoteCallError
from dex.remote.service import ActivityTaskService
from dex.remote.values import PolledTask, RemoteFailure
from dex.v1 import service_pb2 as pb
from dex.v1 import service_pb2_grpc as pb_grpc
from dex.views.secrets import token_problem

log = logging.getLogger("dex.remote")

_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}

Reply = TypeVar("Reply")


class _Servicer:
    """The generated servicer's methods (grpc looks them up by name), each calling the service."""

    def __init__(self, service: ActivityTaskService) -> None:
        self._service = service

    def Poll(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            tasks = self._service.poll(request.worker_id, list(request.names), request.max or 1, request.wait_seconds)
            return pb.PollResponse(tasks=[_task(task) for task in tasks])

        return _answer(context, call)

    def Complete(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            self._service.complete(request.task_id, request.lease_version, _json(request.result_json))
            return pb.CompleteResponse()

        return _answer(context, call)

    def Fail(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            error = request.error
            failure = RemoteFailure(
                type=error.type,
                message=error.message,
                terminal=error.terminal,
                retry_after_seconds=error.retry_after_seconds if error.HasField("retry_after_seconds") else None,
            )
            self._service.fail(request.task_id, request.lease_version, failure)
            return pb.FailResponse()

        return _answer(context, call)

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            return pb.HeartbeatResponse(
                cancel_requested=self._service.heartbeat(request.task_id, request.lease_version)
            )

        return _answer(context, call)


def serve_grpc(
    service: ActivityTaskService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_workers: int = 32,
    token: str | None = None,
) -> Any:
    """Serve ``service`` over gRPC on ``host:port`` (0: a free port, then ``server.port``); the
    started ``grpc.Server`` is returned. ``max_workers`` threads serve the calls, and as many
    more as the service lets long polls wait. With ``token``, every call must carry the metadata
    ``authorization: Bearer <token>`` (else UNAUTHENTICATED), as ``dex web`` requires of HTTP.
    No TLS: bind a loopback address, or put it behind a proxy that terminates TLS."""
    if token is not None and (problem := token_problem(token)) is not None:
        raise ValueError(problem)  # never the token itself: it is a secret
    interceptors = [_TokenCheck(token)] if token is not None else []
    server = grpc.server(
        # a waiting poll holds a thread: room for every poll the gate admits, beside the calls'
        futures.ThreadPoolExecutor(max_workers=max_workers + service.long_polls.limit, thread_name_prefix="dex-grpc"),
        interceptors=interceptors,
    )
    add: Callable[[_Servicer, Any], None] = pb_grpc.add_ActivityTaskServiceServicer_to_server  # generated, untyped
    add(_Servicer(service), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"could not bind the gRPC server to {host}:{port}")
    server.start()
    server.port = bound  # the port it listens on, when 0 was asked
    return server


class _TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc has no type information
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(_request: Any, context: grpc.ServicerContext) -> None:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "a token is required: metadata authorization: Bearer <token>"
            )

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        for key, value in details.invocation_metadata or ():
            given = value.encode() if isinstance(value, str) else bytes(value)
            if key == "authorization" and hmac.compare_digest(given, self._expected):
                return continuation(details)
        return self._deny


def _answer(context: grpc.ServicerContext, call: Callable[[], Reply]) -> Reply:
    try:
        return call()
    except RemoteCallError as exc:
        if exc.retry_after is not None:
            context.set_trailing_metadata((("grpc-retry-pushback-ms", str(exc.retry_after * 1000)),))
        context.abort(_STATUS.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), f"{exc.kind}: {exc.message}")
    except Exception:
        log.exception("a remote worker's gRPC call failed")
        context.abort(grpc.StatusCode.INTERNAL, "InternalError: the call failed inside dex; it is logged")
    raise AssertionError("context.abort raises")  # pragma: no cover


def _task(task: PolledTask) -> Any:
    until = Timestamp()
    until.FromDatetime(task.lease_until)
    return pb.RemoteActivityTask(
        task_id=task.task_id,
        run_id=task.run_id,
        name=task.name,
        attempt=task.attempt,
        args_json=json.dumps(list(task.args), ensure_ascii=False, allow_nan=False),
        lease_version=task.lease_version,
        lease_until=until,
        heartbeat_timeout=task.heartbeat_timeout,
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise InvalidValueError("result_json is not JSON text") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
