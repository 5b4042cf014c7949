"""The OpenAPI 3 document of the JSON API (``GET /v1/openapi.json``), made from the very list
of operations the app serves, so a route cannot be served and left undocumented; and the
vocabulary the operations' declarations share (names, keys, labels), so every field of a kind
is described, and checked (:mod:`dex.web.validation`), alike.

What the document says is what the server does: each operation lists every status it can
answer (403 and 405 included, 401 when the app has a token, 413 where a body is taken), every
error's ``type``, and the rules of every value it takes; ``tests/web/test_schemathesis.py`` holds
the server to it with Schemathesis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dex.app.facade.steps import STEP_STATUSES
from dex.app.ports.attempts import ATTEMPT_KINDS, MAX_RECENT_ATTEMPTS
from dex.app.ports.schedules import OVERLAP_POLICIES
from dex.domain.definitions import NAME_PATTERN, QUEUE_PATTERN
from dex.domain.instance_keys import ID_REUSE
from dex.domain.queue_limits import MAX_RATE_COUNT, MAX_RATE_PERIOD, MIN_RATE_PERIOD
from dex.domain.status import RunStatus
from dex.web.operations import Operation
from dex.web.validation import NO_NUL

# -- the vocabulary of the declarations --------------------------------------------------------
TEXT = {"type": "string", "pattern": NO_NUL}  # any text PostgreSQL can store
NAME = {"type": "string", "pattern": NAME_PATTERN.pattern}  # a workflow, event or schedule name
QUEUE_NAME = {"type": "string", "pattern": QUEUE_PATTERN.pattern}
KEY = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": NO_NUL}  # instance id, concurrency key
LABELS = {"type": "object", "propertyNames": TEXT, "additionalProperties": TEXT, "description": "text to text"}
PRIORITY = {"type": "integer", "minimum": 0, "maximum": 100}
STATUSES = [status.value for status in RunStatus]


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or null (an optional field's ``null`` reads as absent)."""
    kind = schema["type"]
    return {**schema, "type": [*([kind] if isinstance(kind, str) else kind), "null"]}


STRING = {"type": "string"}
NULLABLE_STRING = {"type": ["string", "null"]}
# a queue's rate limit (docs/reference/contract.md §15): at most `starts` starts in any window of `period` seconds
RATE_LIMIT_DOC: dict[str, Any] = {
    "type": "object",
    "required": ["starts", "period"],
    "properties": {
        "starts": {"type": "integer", "minimum": 1, "maximum": MAX_RATE_COUNT},
        "period": {
            "type": "number",
            "minimum": MIN_RATE_PERIOD.total_seconds(),
            "maximum": MAX_RATE_PERIOD.total_seconds(),
            "description": "seconds",
        },
    },
}
TIME = {"type": ["string", "null"], "format": "date-time"}
SECONDS = {"type": "number", "description": "seconds"}
FAILURE = {
    "type": ["object", "null"],
    "properties": {
        "type": STRING,
        "message": STRING,
        "stack_trace": STRING,
        "terminal": {"type": "boolean"},
        "cause": {"type": ["object", "null"]},
    },
}
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": {
                        "type": "string",
                        "description": "what was refused: a fixed word (BadRequest, Unauthorized, ...) or, for "
                        "404, 409 and 422, the name of the error dex raised (RunNotFoundError, "
                        "InvalidStateError, NotRegisteredError, ValueError, ...); see each response",
                    },
                    "message": STRING,
                },
            }
        },
    },
    "Run": {
        "type": "object",
        "properties": {
            "run_id": STRING,
            "workflow_name": STRING,
            "instance_id": NULLABLE_STRING,
            "status": {"type": "string", "enum": STATUSES},
            "custom_status": NULLABLE_STRING,
            "queue": STRING,
            "priority": {"type": "integer"},
            "concurrency_key": NULLABLE_STRING,
            "labels": {"type": "object", "additionalProperties": STRING},
            "parent_run_id": NULLABLE_STRING,
            "created_at": TIME,
            "started_at": TIME,
            "completed_at": TIME,
            "result": {"description": "the result, decoded to JSON"},
            "failure": FAILURE,
            "code_version": NULLABLE_STRING,
            "task_failure": FAILURE,
            "scheduled_at": TIME,
            "forked_from": NULLABLE_STRING,
            "deadline": TIME,
            "unread_events": {"type": "integer", "description": "events the run received and never read"},
        },
    },
    "ActivityStep": {
        "type": "object",
        "description": "an activity step of the run (its ActivityTaskCreated is event seq) and its attempts; "
        "status unknown: its task is gone and its outcome, if any, lies further in the history than a page reads",
        "required": ["seq", "name", "status", "attempts", "failed", "lost", "recent_failures"],
        "properties": {
            "seq": {"type": "integer"},
            "name": STRING,
            "status": {"type": "string", "enum": list(STEP_STATUSES)},
            "attempts": {"type": "integer", "description": "attempts begun, the one under way included"},
            "failed": {"type": "integer", "description": "attempts that failed, the final failure included"},
            "lost": {"type": "integer", "description": "attempts lost to a crash: begun, never reported"},
            "scheduled_at": TIME,
            "ended_at": TIME,
            "next_retry_at": {**TIME, "description": "while retrying: when the next attempt may begin"},
            "lease_expires_at": {**TIME, "description": "while running: when the attempt's lease runs out"},
            "recent_failures": {
                "type": "array",
                "maxItems": MAX_RECENT_ATTEMPTS,
                "description": "the newest failed and lost attempts, newest first",
                "items": {
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer"},
                        "kind": {"type": "string", "enum": list(ATTEMPT_KINDS)},
                        "at": {"type": "string", "format": "date-time"},
                        "failure": FAILURE,
                    },
                },
            },
        },
    },
    "Queue": {
        "type": "object",
        "properties": {
            "name": STRING,
            "kind": {"type": "string", "enum": ["workflow", "activity"]},
            "status": {"type": "string", "enum": ["ACTIVE", "PAUSED"]},
            "capacity": {"type": "integer"},
            "depth": {"type": "integer"},
            "key_concurrency": {"type": "integer", "minimum": 1},
            "rate_limit": nullable(RATE_LIMIT_DOC),
        },
    },
    "Engine": {
        "type": "object",
        "description": "a live engine (docs/reference/contract.md §15): listed while its heartbeat is recent",
        "required": ["node_id", "host", "pid", "workflows", "activities", "queues", "started_at", "last_seen"],
        "properties": {
            "node_id": STRING,
            "host": STRING,
            "pid": {"type": "integer"},
            "code_version": NULLABLE_STRING,
            "workflows": {"type": "array", "items": STRING},
            "activities": {"type": "array", "items": STRING},
            "queues": {"type": "array", "items": STRING},
            "started_at": {"type": "string", "format": "date-time"},
            "last_seen": {"type": "string", "format": "date-time"},
        },
    },
    "Schedule": {
        "type": "object",
        "properties": {
            "name": STRING,
            "workflow_name": STRING,
            "cron": NULLABLE_STRING,
            "every": {"type": ["number", "null"], "description": "seconds"},
            "timezone": STRING,
            "overlap": {"type": "string", "enum": list(OVERLAP_POLICIES)},
            "jitter": SECONDS,
            "catchup_window": SECONDS,
            "paused": {"type": "boolean"},
            "note": STRING,
            "next_fire_at": TIME,
            "last_fire_at": TIME,
            "last_run_id": NULLABLE_STRING,
            "start_at": TIME,
            "end_at": TIME,
            "labels": {"type": "object", "additionalProperties": STRING},
            "id_reuse": {"type": "string", "enum": list(ID_REUSE)},
        },
    },
}
# each status an operation can answer with an error, and the error types it then carries
ERRORS: dict[int, tuple[str, list[str] | None]] = {
    400: (
        "The request breaks what this document says of it: a body that is not a JSON object (not UTF-8, "
        "not strict JSON: NaN, 1e999, nested too deeply; or an array, a string, ...), a value of the wrong "
        "type, out of its range or not matching its pattern, a NUL or a lone surrogate where text is due, a "
        "required field missing, or a cursor this API did not give out. Every route answers it alike, the "
        "activity-task routes too: type BadRequest, and a message naming the field (or saying what is wrong "
        "with the body: 'the body is not JSON: ...', 'the body must be a JSON object, got array')",
        ["BadRequest"],
    ),
    401: ("No valid token (the answer carries WWW-Authenticate: Bearer)", ["Unauthorized"]),
    403: (
        "A state-changing request from another origin, or, without a token, a Host that is not a loopback name",
        ["Forbidden"],
    ),
    404: ("No such run, queue, schedule, task or route (type: the error's name)", None),
    405: ("This path does not serve the method (the Allow header lists those it does)", ["MethodNotAllowed"]),
    409: ("Not allowed in the current state: a run that has ended, a lease lost (type: the error's name)", None),
    413: ("The request body is larger than the app's limit", ["PayloadTooLarge"]),
    422: (
        "A well-formed value dex refuses for what it means: arguments the workflow cannot take, a fork point "
        "its history has not, a payload with no JSON form (type: the error's name)",
        None,
    ),
    500: ("An unexpected error (no stack trace; it is logged)", ["InternalError"]),
    503: ("The store is unavailable; the request may be retried", ["StoreUnavailable", "Unavailable"]),
}
ERROR_NAME = {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"}


def operation_id(method: str, path: str) -> str:
    """The ``operationId`` of an operation: ``post_v1_runs_run_id_cancel``."""
    return method.lower() + path.replace("/", "_").replace("{", "").replace("}", "")


def links(
    targets: Iterable[tuple[str, str, str]],
    *,
    query: dict[str, str] | None = None,
    request_body: dict[str, str] | None = None,
    **parameters: str,
) -> dict[str, Any]:
    """OpenAPI links from an answer to the operations ``targets`` (name, method, path), their
    path parameters taken from the answer (``run_id="$response.body#/run_id"``), and with
    ``query`` parameters and ``request_body`` fields too."""
    named = {**parameters, **{f"query.{key}": value for key, value in (query or {}).items()}}
    return {
        name: {
            "operationId": operation_id(method, path),
            "parameters": dict(named),
            **({"requestBody": request_body} if request_body is not None else {}),
        }
        for name, method, path in targets
    }


RUN_TARGETS = (
    ("GetRun", "GET", "/v1/runs/{run_id}"),
    ("GetHistory", "GET", "/v1/runs/{run_id}/history"),
    ("GetActivitySteps", "GET", "/v1/runs/{run_id}/activity-steps"),
    ("Cancel", "POST", "/v1/runs/{run_id}/cancel"),
    ("Terminate", "POST", "/v1/runs/{run_id}/terminate"),
    ("Suspend", "POST", "/v1/runs/{run_id}/suspend"),
    ("Resume", "POST", "/v1/runs/{run_id}/resume"),
    ("SendEvent", "POST", "/v1/runs/{run_id}/events"),
    ("Fork", "POST", "/v1/runs/{run_id}/fork"),
)


def run_links(run_id: str = "$response.body#/run_id") -> dict[str, Any]:
    """Links from an answer naming a run (a new one, a fork, a schedule's trigger) to its calls."""
    return links(RUN_TARGETS, run_id=run_id)


def document(operations: Iterable[Operation], version: str, *, token: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``, served by an app with a token or without."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation, token)
    paths["/v1/openapi.json"] = {
        "get": {
            "summary": "This document",
            "tags": ["meta"],
            "operationId": "openapi",
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
                **_errors((403, 405, *((401,) if token else ())), token),
            },
        }
    }
    access = (
        "Every call needs the app's token: Authorization: Bearer TOKEN."
        if token
        else "This app has no token: it answers only requests whose Host is a loopback name (127.0.0.1, "
        "localhost, [::1]) or one of its allowed hosts, and no credentials are asked for; any other Host is "
        "a 403. Serve it on 127.0.0.1, or give it a token."
    )
    result: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "dex",
            "version": version,
            "description": "The JSON API of dex, a durable execution engine on PostgreSQL. " + access,
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS},
        "security": [{"bearer": []}] if token else [],
    }
    if token:
        result["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "the token the app was made with"}
        }
    return result


def _errors(codes: Iterable[int], token: bool) -> dict[str, Any]:
    answers = {}
    for code in sorted(set(codes)):
        description, types = ERRORS[code]
        kind = {"type": "string", "enum": types} if types is not None else ERROR_NAME
        schema = {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": kind, "message": STRING},
                }
            },
        }
        answers[str(code)] = {"description": description, "content": {"application/json": {"schema": schema}}}
        if code == 401:
            answers[str(code)]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}}
        if code == 405:
            answers[str(code)]["headers"] = {"Allow": {"required": True, "schema": STRING}}
        if code == 503:  # a remote worker's poll while the most long polls are open: poll again after it
            answers[str(code)]["headers"] = {"Retry-After": {"schema": STRING, "description": "seconds"}}
    return answers


def _operation(operation: Operation, token: bool) -> dict[str, Any]:
    codes = {*operation.errors, 403, 405, 500, 503}
    if token:
        codes.add(401)
    else:
        codes.discard(401)
    if operation.method.upper() not in ("GET", "HEAD"):
        codes.add(413)  # any body is counted as it streams in
    if operation.params or operation.body is not None:
        codes.add(400)
    success: dict[str, Any] = {
        "description": "OK",
        "content": {operation.media_type: {"schema": operation.response}},
    }
    if operation.links:
        success["links"] = operation.links
    spec: dict[str, Any] = {
        "summary": operation.summary,
        "tags": [operation.tag],
        "operationId": operation_id(operation.method, operation.path),
        "responses": {
            str(operation.status): success,
            **{
                str(code): {"description": text, "content": {"application/json": {"schema": schema}}}
                for code, (text, schema) in operation.also.items()
            },
            **_errors(codes, token),
        },
    }
    if operation.params:
        spec["parameters"] = [
            {
                "name": param.name,
                "in": param.where,
                "required": param.where == "path",
                "description": param.description,
                "schema": {"type": "array", "items": param.schema} if param.repeated else param.schema,
                **({"explode": True} if param.repeated else {}),
            }
            for param in operation.params
        ]
    if operation.body is not None:
        spec["requestBody"] = {
            "required": operation.body_required,
            "content": {"application/json": {"schema": operation.body}},
        }
    return spec
