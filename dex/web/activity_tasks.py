"""The remote workers' API (docs/reference/contract.md §13) as operations of the dashboard's app.

:mod:`dex.remote.http_routes` serves ``/v1/activity-tasks`` over one
:class:`~dex.remote.service.ActivityTaskService`; here its handlers become
:class:`~dex.web.operations.Operation` values, so ``create_app`` serves them behind the same
token and origin checks as the rest of ``/v1`` and documents them in ``/v1/openapi.json``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dex.remote.http_routes import activity_task_routes
from dex.remote.service import ActivityTaskService
from dex.remote.values import MAX_NAMES, MAX_TASKS, MAX_TEXT, MAX_WAIT_SECONDS
from dex.web.openapi import TEXT, links, nullable
from dex.web.operations import Handler, Operation, Param

STRING = {"type": "string"}
WORD = {**TEXT, "minLength": 1, "maxLength": MAX_TEXT}  # a worker id, an activity name
TASK_ID = Param(
    name="task_id",
    where="path",
    schema={"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    description="The task's id, as polled",
)
LEASE = {
    "lease_version": {"type": "integer", "description": "the lease_version the poll gave (else a 409)"},
    "worker_id": {**nullable(WORD), "description": "when given, the worker_id that polled (else a 409)"},
}
TASK = {
    "type": "object",
    "properties": {
        "task_id": {"type": "integer"},
        "run_id": STRING,
        "name": STRING,
        "attempt": {"type": "integer"},
        "args": {"type": "array", "description": "the arguments' JSON forms"},
        "lease_version": {"type": "integer"},
        "lease_until": {"type": "string", "format": "date-time"},
        "heartbeat_timeout": {"type": "number", "description": "seconds"},
    },
}


def operations(service: ActivityTaskService) -> list[Operation]:
    """Poll, complete, fail and heartbeat, served by ``service``."""
    endpoints = {route.path: route.endpoint for route in activity_task_routes(service)}

    def handler(path: str) -> Handler:
        endpoint: Any = endpoints[path]

        async def handle(request: Request, _web: Any) -> Response:
            response: Response = await endpoint(request)  # answers its own errors (http_routes)
            return response

        return handle

    def operation(path: str, summary: str, body: dict[str, Any], response: dict[str, Any], **more: Any) -> Operation:
        return Operation(
            method="POST",
            path=path,
            handler=handler(path),
            summary=summary,
            body={"type": "object", **body},
            response=response,
            tag="activity-tasks",
            errors=(400, 401, 404, 409, 422),
            **more,
        )

    return [
        operation(
            "/v1/activity-tasks/poll",
            "Claim up to max activity tasks of these names, waiting up to wait_seconds (docs/reference/contract.md §13)",
            {
                "required": ["worker_id", "names"],
                "properties": {
                    "worker_id": WORD,
                    "names": {"type": "array", "items": WORD, "minItems": 1, "maxItems": MAX_NAMES},
                    "max": {"type": "integer", "minimum": 1, "maximum": MAX_TASKS, "default": 1},
                    "wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0},
                },
                "examples": [{"worker_id": "mailer-1", "names": ["send-email"], "max": 1, "wait_seconds": 10}],
            },
            {"type": "array", "items": TASK},
            # the first task's calls, under the lease the poll handed out to the worker that polled
            links=links(
                (
                    ("Complete", "POST", "/v1/activity-tasks/{task_id}/complete"),
                    ("Fail", "POST", "/v1/activity-tasks/{task_id}/fail"),
                    ("Heartbeat", "POST", "/v1/activity-tasks/{task_id}/heartbeat"),
                ),
                request_body={
                    "lease_version": "$response.body#/0/lease_version",
                    "worker_id": "$request.body#/worker_id",
                },
                task_id="$response.body#/0/task_id",
            ),
        ),
        operation(
            "/v1/activity-tasks/{task_id}/complete",
            "Complete a claimed task with its result (JSON); 409 when its lease is no longer held",
            {"required": ["lease_version", "result"], "properties": {**LEASE, "result": {}}},
            {"type": "object"},
            params=(TASK_ID,),
        ),
        operation(
            "/v1/activity-tasks/{task_id}/fail",
            "Fail a claimed task's attempt (retried under its policy unless terminal)",
            {
                "required": ["lease_version", "error"],
                "properties": {
                    **LEASE,
                    "error": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "message": STRING,
                            "terminal": {"type": "boolean"},
                            "retry_after_seconds": {
                                "type": ["number", "null"],
                                "minimum": 0,
                                "maximum": 366 * 24 * 3600,
                            },
                        },
                    },
                },
            },
            {"type": "object"},
            params=(TASK_ID,),
        ),
        operation(
            "/v1/activity-tasks/{task_id}/heartbeat",
            "Renew a claimed task's lease; says whether its run was cancelled or ended",
            {"required": ["lease_version"], "properties": LEASE},
            {"type": "object", "properties": {"cancel_requested": {"type": "boolean"}}},
            params=(TASK_ID,),
        ),
    ]
