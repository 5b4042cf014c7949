"""The remote workers' HTTP API (docs/reference/contract.md §13): Starlette routes over :class:`ActivityTaskService`.

``activity_task_routes(service)`` returns the routes of ``/v1/activity-tasks``; mount them in
``dex.web.create_app`` (where the token is checked) or in any Starlette application::

    POST /v1/activity-tasks/poll                 {worker_id, names, max, wait_seconds} -> [task, ...]
    POST /v1/activity-tasks/{task_id}/complete   {lease_version, result, worker_id?}   -> {}
    POST /v1/activity-tasks/{task_id}/fail       {lease_version, error: {type, message, terminal,
                                                  retry_after_seconds}, worker_id?}     -> {}
    POST /v1/activity-tasks/{task_id}/heartbeat  {lease_version, worker_id?}           -> {cancel_requested}

``lease_version`` is the token the poll handed out with the task; a ``worker_id``, when sent,
must be the one that polled. A refused call answers ``{"error": {"type", "message"}}`` with the
status of its :class:`~dex.remote.errors.RemoteCallError` (400 ``BadRequest`` for a body that is not
a JSON object or lacks a field, as the rest of ``/v1`` answers one; 404, 409, 413, 422; 503 when the store
failed, or when a poll would wait while the most long polls are open: then with ``Retry-After``),
and changed nothing. A long poll waits on the event loop (``ActivityTaskService.poll_async``),
holding no thread; the other calls are short and run in Starlette's thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dex.remote.errors import BodyTooLargeError, InvalidRequestError, RemoteCallError
from dex.remote.service import ActivityTaskService
from dex.remote.values import PolledTask, RemoteFailure
from dex.serialization import json_body

log = logging.getLogger("dex.remote")

_MAX_BODY = 8 * 1024 * 1024  # bytes; a result is bounded by the service's max_payload_size anyway
_MISSING = object()


def activity_task_routes(service: ActivityTaskService) -> list[Route]:
    """The routes of the remote workers' API, served by ``service``."""

    async def poll(request: Request) -> Response:
        body = await _body(request)
        # the wait is a coroutine: idle workers hold no thread of the pool the other calls need
        tasks = await service.poll_async(
            _field(body, "worker_id"), _field(body, "names"), body.get("max", 1), body.get("wait_seconds", 0)
        )
        return JSONResponse([task_json(task) for task in tasks])

    async def complete(request: Request) -> Response:
        body = await _body(request)
        task_id, version = request.path_params["task_id"], _field(body, "lease_version")
        await run_in_threadpool(service.complete, task_id, version, _field(body, "result"), body.get("worker_id"))
        return JSONResponse({})

    async def fail(request: Request) -> Response:
        body = await _body(request)
        task_id, version = request.path_params["task_id"], _field(body, "lease_version")
        error = _field(body, "error")
        if not isinstance(error, dict):
            raise InvalidRequestError("error must be an object {type, message, terminal, retry_after_seconds}")
        failure = RemoteFailure(
            type=_field(error, "type", "error."),
            message=error.get("message", ""),
            terminal=error.get("terminal", False),
            retry_after_seconds=error.get("retry_after_seconds"),
        )
        await run_in_threadpool(service.fail, task_id, version, failure, body.get("worker_id"))
        return JSONResponse({})

    async def heartbeat(request: Request) -> Response:
        body = await _body(request)
        task_id, version = request.path_params["task_id"], _field(body, "lease_version")
        cancel = await run_in_threadpool(service.heartbeat, task_id, version, body.get("worker_id"))
        return JSONResponse({"cancel_requested": cancel})

    return [
        Route("/v1/activity-tasks/poll", _answering(poll), methods=["POST"]),
        Route("/v1/activity-tasks/{task_id}/complete", _answering(complete), methods=["POST"]),
        Route("/v1/activity-tasks/{task_id}/fail", _answering(fail), methods=["POST"]),
        Route("/v1/activity-tasks/{task_id}/heartbeat", _answering(heartbeat), methods=["POST"]),
    ]


def task_json(task: PolledTask) -> dict[str, Any]:
    """A polled task as the API sends it (``lease_until`` in ISO 8601, UTC)."""
    return {
        "task_id": task.task_id,
        "run_id": task.run_id,
        "name": task.name,
        "attempt": task.attempt,
        "args": list(task.args),
        "lease_version": task.lease_version,
        "lease_until": task.lease_until.isoformat(),
        "heartbeat_timeout": task.heartbeat_timeout,
    }


def error_response(status: int, kind: str, message: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def _answering(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """``handler``, with a refused call as its error response, and anything else as a 500 that
    names no detail (it is logged): no exception escapes to the server."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except RemoteCallError as exc:
            return error_response(exc.status, exc.kind, exc.message, exc.retry_after)
        except Exception:
            log.exception("a remote worker's call %s failed", request.url.path.encode("ascii", "replace"))
            return error_response(500, "InternalError", "the call failed inside dex; it is logged")

    return answer


async def _body(request: Request) -> dict[str, Any]:
    data = await request.body()
    if len(data) > _MAX_BODY:
        raise BodyTooLargeError(f"the request body is larger than {_MAX_BODY} bytes")
    try:  # read, and refused, as the JSON API reads its bodies: one answer for the same bytes
        return json_body.json_object(data)
    except json_body.MalformedBodyError as exc:
        raise InvalidRequestError(str(exc)) from None


def _field(body: dict[str, Any], name: str, prefix: str = "") -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING:
        raise InvalidRequestError(f"{prefix}{name} is required")  # worded as the app's check at the door
    return value
