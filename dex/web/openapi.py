"""The OpenAPI 3 document of the JSON API (``GET /v1/openapi.json``), made from the very list
of operations the app serves, so a route cannot be served and left undocumented."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dex.web.operations import Operation

STRING = {"type": "string"}
NULLABLE_STRING = {"type": ["string", "null"]}
TIME = {"type": ["string", "null"], "format": "date-time"}
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
                "properties": {"type": STRING, "message": STRING},
            }
        },
    },
    "Run": {
        "type": "object",
        "properties": {
            "run_id": STRING,
            "workflow_name": STRING,
            "instance_id": NULLABLE_STRING,
            "status": {
                "type": "string",
                "enum": ["CREATED", "RUNNING", "SUSPENDED", "COMPLETED", "FAILED", "CANCELLED"],
            },
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
            "overlap": STRING,
            "paused": {"type": "boolean"},
            "note": STRING,
            "next_fire_at": TIME,
            "last_fire_at": TIME,
            "last_run_id": NULLABLE_STRING,
        },
    },
}
ERROR_TEXT = {
    400: "The request cannot be read (bad JSON, a bad parameter)",
    401: "No valid token",
    403: "A state-changing request from another origin",
    404: "No such run, queue or schedule",
    409: "Not allowed in the current state",
    422: "A value dex refuses",
    500: "An unexpected error",
    503: "The store is unavailable",
}


def document(operations: Iterable[Operation], version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
    paths["/v1/openapi.json"] = {
        "get": {
            "summary": "This document",
            "tags": ["meta"],
            "operationId": "openapi",
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dex",
            "version": version,
            "description": "The JSON API of dex, a durable execution engine on PostgreSQL (SPEC §12).",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


def _operation(operation: Operation) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "summary": operation.summary,
        "tags": [operation.tag],
        "operationId": operation.method.lower() + operation.path.replace("/", "_").replace("{", "").replace("}", ""),
        "responses": {
            str(operation.status): {
                "description": "OK",
                "content": {"application/json": {"schema": operation.response}},
            },
            **{
                str(code): {
                    "description": ERROR_TEXT[code],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for code in (*operation.errors, 500, 503)
            },
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
        spec["requestBody"] = {"required": False, "content": {"application/json": {"schema": operation.body}}}
    return spec
