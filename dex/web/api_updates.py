"""The JSON API of updates and queries under ``/v1`` (docs/reference/contract.md §14):
``POST /v1/runs/{run_id}/updates`` and ``POST /v1/runs/{run_id}/queries``.

Both go through the engine's public calls, which check every value as they do for any caller.
An update waits for its answer at most ``timeout`` seconds (30 by default, at most
:data:`MAX_UPDATE_WAIT`, so a request never holds a worker thread of the server for long). No
answer by then is a 202 (accepted, not yet answered) that names the update id, which the
client sends again to get the answer once it is there (the same id never runs the handler
twice): the run still answers it, so it is no error of the client's or the server's. A query runs the workflow's code:
an app over an engine that registers the workflow answers it; one over a bare database (``dex
web``) cannot, and says so (409 ``QueryError``).

Statuses: the handler's result is a 200; an unknown run a 404. What the run answers is a 409,
the error's name saying which: a refusal by the validator or no handler of that name
(``UpdateRejectedError``: handlers are registered by the run's code as it goes, so a name is
refused by the run's state, not by its form), a handler that raised (``UpdateFailedError``,
the run goes on), an ended run (``InvalidStateError``), a query that cannot answer
(``QueryError``).
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dex.domain.errors import QueryError, UpdateFailedError, UpdateRejectedError
from dex.views.render import jsonable
from dex.web import inputs
from dex.web.errors import ApiError, bad_request, first_line
from dex.web.openapi import KEY, NAME
from dex.web.operations import Operation, Param, blocking, json

MAX_UPDATE_WAIT = 300  # seconds an update request may wait for its answer
DEFAULT_UPDATE_WAIT = 30
RUN_ID = Param(name="run_id", where="path", description="The run's id")
STRING = {"type": "string"}
ARGS = {"type": "array", "description": "the handler's arguments, as JSON"}


def _run_id(request: Request) -> str:
    return inputs.checked(request.path_params["run_id"], "run_id")


def _name(body: dict[str, Any]) -> str:
    name = inputs.field(body, "name", str)
    if name is None:
        raise bad_request("name (the handler's name) is required")
    return str(name)


async def update(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    run_id = _run_id(request)
    name = _name(body)
    args = inputs.field(body, "args", list, [])
    update_id = inputs.field(body, "update_id", str) or str(uuid.uuid4())  # returned: sent again after a 202
    timeout = inputs.whole_number(body, "timeout", 0, MAX_UPDATE_WAIT, DEFAULT_UPDATE_WAIT)
    try:
        result = await blocking(web.engine.update, run_id, name, *args, update_id=update_id, timeout=timeout)
    except UpdateRejectedError as exc:
        raise ApiError(409, "UpdateRejectedError", first_line(exc)) from None
    except UpdateFailedError as exc:
        raise ApiError(409, "UpdateFailedError", first_line(exc)) from None
    except TimeoutError as exc:
        pending = {"run_id": run_id, "update_id": update_id, "answered": False, "message": first_line(exc)}
        return json(pending, status=202)
    return json({"run_id": run_id, "update_id": update_id, "answered": True, "result": jsonable(result)})


async def query(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    run_id = _run_id(request)
    name = _name(body)
    args = inputs.field(body, "args", list, [])
    try:
        result = await blocking(web.engine.query, run_id, name, *args)
    except QueryError as exc:
        raise ApiError(409, "QueryError", first_line(exc)) from None
    return json({"run_id": run_id, "result": jsonable(result)})


def update_operations() -> list[Operation]:
    """The ``/v1`` operations of updates and queries."""
    return [
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/updates",
            handler=update,
            summary="Send an update to a run and wait for the handler's answer (a 202 when none came within "
            "timeout seconds: send the same update_id again for the answer; it never runs twice)",
            params=(RUN_ID,),
            body={
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": NAME,
                    "args": ARGS,
                    "update_id": {**KEY, "description": "makes the update idempotent (default: a new UUID)"},
                    "timeout": {
                        "type": ["integer", "null"],
                        "minimum": 0,
                        "maximum": MAX_UPDATE_WAIT,
                        "description": f"seconds to wait for the answer (default {DEFAULT_UPDATE_WAIT})",
                    },
                },
            },
            response={
                "type": "object",
                "properties": {
                    "run_id": STRING,
                    "update_id": STRING,
                    "answered": {"const": True},
                    "result": {"description": "any JSON"},
                },
            },
            also={
                202: (
                    "No answer within the timeout: the run still answers it; send the same update_id again",
                    {
                        "type": "object",
                        "properties": {
                            "run_id": STRING,
                            "update_id": STRING,
                            "answered": {"const": False},
                            "message": STRING,
                        },
                    },
                )
            },
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/queries",
            handler=query,
            summary="Ask a run's query handler (read-only, never recorded; ended runs answer too). Needs an app "
            "over an engine that registers the workflow",
            params=(RUN_ID,),
            body={"type": "object", "required": ["name"], "properties": {"name": NAME, "args": ARGS}},
            response={"type": "object", "properties": {"run_id": STRING, "result": {"description": "any JSON"}}},
        ),
    ]
