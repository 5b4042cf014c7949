"""The JSON API's routes as data: each ``Operation`` is a method, a path, a handler and what the
OpenAPI document says of it, so the document is made from the very list the app serves.

``create_app`` serves ``dex.web.api.operations()`` (and its ``extra_operations``, e.g. the
remote workers' ``/v1/activity-tasks`` routes) under the same security middleware. Handlers are
``async`` functions of ``(request, web)`` that do their blocking work (the store) in a thread
(:func:`blocking`); whatever a handler raises becomes the error document of
:mod:`dex.web.errors`. Before a handler runs, its request is checked against the schemas its
operation declares (:mod:`dex.web.validation`): what the document rules out is a 400 there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dex.web import inputs, validation
from dex.web.errors import classify, error_response

P = ParamSpec("P")
T = TypeVar("T")

Handler = Callable[[Request, Any], Awaitable[Response]]


@attrs.frozen(kw_only=True)
class Param:
    """A query or path parameter, as the OpenAPI document describes it."""

    name: str
    where: str = "query"  # "query" or "path"
    schema: dict[str, Any] = attrs.field(factory=lambda: {"type": "string", "pattern": validation.NO_NUL})
    description: str = ""
    repeated: bool = False

    def check(self, request: Request) -> None:
        """A 400 naming this parameter unless the request's value is one its schema allows
        (an absent query parameter is allowed: none is required)."""
        where = f"{self.where} parameter {self.name}"
        if self.where == "path":
            validation.check_text(request.path_params[self.name], self.schema, where)
            return
        if self.repeated:
            texts = request.query_params.getlist(self.name)
        else:
            texts = [request.query_params[self.name]] if self.name in request.query_params else []
        for text in texts:
            validation.check_text(text, self.schema, where)


@attrs.frozen(kw_only=True)
class Operation:
    """One API route: ``method`` and ``path`` (Starlette's syntax, ``/v1/runs/{run_id}``)."""

    method: str
    path: str
    handler: Handler
    summary: str
    params: tuple[Param, ...] = ()
    body: dict[str, Any] | None = None  # the JSON schema of the request body (a JSON object)
    response: dict[str, Any] = attrs.field(factory=lambda: {"type": "object"})
    status: int = 200
    # other answers that are not errors: status -> (description, JSON schema of the body)
    also: dict[int, tuple[str, dict[str, Any]]] = attrs.field(factory=dict)
    errors: tuple[int, ...] = (400, 401, 404, 409, 422)
    tag: str = "runs"
    # OpenAPI links of the answer (name -> link object), e.g. from a new run to its history
    links: dict[str, Any] = attrs.field(factory=dict)
    # what a success answers with (server-sent events: "text/event-stream")
    media_type: str = "application/json"

    @property
    def body_required(self) -> bool:
        """Whether a request must carry a body: when its schema requires a field (an empty body
        reads as ``{}``, which is then refused for the field it lacks)."""
        return self.body is not None and bool(self.body.get("required"))

    async def check(self, request: Request) -> None:
        """A 400 unless the request's parameters and body are what the document says."""
        for param in self.params:
            param.check(request)
        if self.body is not None:
            validation.check(await inputs.json_object(request), self.body, "")


async def blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a call that blocks (the store's I/O) off the event loop."""
    return await run_in_threadpool(fn, *args, **kwargs)


def json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def routes(operations: Iterable[Operation], web: Any) -> list[Route]:
    """Starlette routes serving ``operations`` over ``web`` (a :class:`dex.web.app.Web`)."""
    by_path: dict[str, dict[str, Operation]] = {}
    for operation in operations:
        by_path.setdefault(operation.path, {})[operation.method.upper()] = operation
    return [Route(path, _endpoint(methods, web), methods=sorted(methods)) for path, methods in by_path.items()]


def _endpoint(methods: dict[str, Operation], web: Any) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        operation = methods[request.method if request.method != "HEAD" else "GET"]
        try:
            await operation.check(request)
            return await operation.handler(request, web)
        except BaseException as exc:  # noqa: BLE001 - answered as JSON; classify re-raises PASS_THROUGH
            return error_response(classify(exc))

    return endpoint
