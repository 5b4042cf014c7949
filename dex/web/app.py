"""``create_app``: the dashboard and the JSON API as one ASGI application (docs/reference/contract.md §12).

The app serves one engine: the one passed in, or, for a bare store (an adapter), an engine
with no registered code over it, as the command line uses (it can do all the app does: read,
cancel, suspend, resume, send events, run the queues and schedules, and start a workflow by
name, the run made for the engines that have its code). It never starts that engine: the app
reads and requests, the workers run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from dex.app.facade.engine import Engine
from dex.app.ports.store import QueueInfo, RunRecord, Store
from dex.domain.errors import NotFoundError, RunNotFoundError
from dex.remote.service import ActivityTaskService
from dex.views.render import jsonable
from dex.web import activity_tasks, api, pages
from dex.web.body_limit import (
    ACTIVITY_TASKS,
    DEFAULT_MAX_ACTIVITY_TASK_BODY,
    DEFAULT_MAX_BODY,
    BodyLimit,
    check_limit,
)
from dex.web.docs_link import DEFAULT_DOCS_URL, dashboard_docs_link, docs_mount, docs_url_problem
from dex.web.errors import ApiError, error_response
from dex.web.insights import Insights, PortInsights
from dex.web.openapi import document
from dex.web.operations import Operation, routes
from dex.web.security import DEFAULT_SESSION_LIFETIME, LOOPBACK_HOSTS, Guard, route_path
from dex.web.signin_limit import SignInLimiter
from dex.web.signing import Signer

STATIC = Path(__file__).parent / "static"


class Web:
    """What the routes serve: the engine, its store, the dashboard's insights, the signer of
    what the app hands out (cursors, notes, sessions) and the link of the pages' "Docs"."""

    def __init__(
        self,
        engine: Engine,
        signer: Signer,
        insights: Insights | None = None,
        docs_link: str = dashboard_docs_link(DEFAULT_DOCS_URL),
    ) -> None:
        self.engine = engine
        self.store: Store = engine.store
        self.signer = signer
        self.insights = insights if insights is not None else insights_for(engine.store)
        self.docs_link = docs_link

    def record(self, run_id: str) -> RunRecord:
        found = self.store.get_run(run_id)
        if found is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return found

    def queue(self, name: str, kind: str) -> dict[str, Any]:
        for info in self.engine.list_queues():
            if info.name == name and info.kind == kind:
                return queue_document(info)
        raise NotFoundError(f"no {kind} queue named {name!r}")


def insights_for(store: Store) -> Insights:
    """The best insights for ``store``: SQL for PostgreSQL, the ports for anything else."""
    from dex.adapters.postgres import PostgresAdapter

    if isinstance(store, PostgresAdapter):
        from dex.web.pg_insights import PostgresInsights

        return PostgresInsights(store)
    return PortInsights(store)


def queue_document(info: QueueInfo) -> dict[str, Any]:
    return jsonable(info)  # type: ignore[no-any-return]


def create_app(
    adapter_or_engine: Store | Engine,
    token: str | None = None,
    *,
    extra_operations: Iterable[Operation] = (),
    allowed_hosts: Iterable[str] | None = None,
    activity_task_service: ActivityTaskService | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    max_activity_task_body_bytes: int = DEFAULT_MAX_ACTIVITY_TASK_BODY,
    session_lifetime: timedelta = DEFAULT_SESSION_LIFETIME,
    signin_limiter: SignInLimiter | None = None,
    docs_url: str = DEFAULT_DOCS_URL,
    docs_dir: str | os.PathLike[str] | None = None,
) -> Starlette:
    """The dashboard and the JSON API over ``adapter_or_engine``, as a Starlette (ASGI) app.

    ``token``: every request must then carry it (``Authorization: Bearer``, or the cookie of
    the sign-in form). Without a token, the app answers only requests whose ``Host`` is a
    loopback name (or one of ``allowed_hosts``): serve it on 127.0.0.1, or give it a token.
    ``extra_operations`` are further ``/v1`` routes, served and documented like the app's own.
    The remote workers' ``/v1/activity-tasks`` (docs/reference/contract.md §13) are served by ``activity_task_service``
    (by default one over the engine: its long polls wake when that engine makes activity work).

    A request body larger than ``max_body_bytes`` (1 MiB), or ``max_activity_task_body_bytes``
    (8 MiB) on ``/v1/activity-tasks/``, is refused with a 413 while it streams in, on every
    route (:mod:`dex.web.body_limit`). The sign-in form's session lasts ``session_lifetime``;
    ``signin_limiter`` bounds wrong tokens per client (by default 10 in 5 minutes).
    ``docs_url`` is the base URL of the documentation site, whose page about the dashboard the
    pages' "Docs" link opens (by default ``/docs/`` on the dashboard's own host:
    :mod:`dex.web.docs_link`). ``docs_dir``, a built site (``mkdocs build``), is served under
    ``/docs/``; without it, ``/docs/`` answers a page that says how to build and serve the site,
    so the default link never ends on "not found".
    """
    if token is not None:
        if not isinstance(token, str) or not token or token != token.strip() or not token.isprintable():
            raise ValueError("token must be a non-empty printable string without surrounding spaces")
    check_limit("max_body_bytes", max_body_bytes)
    check_limit("max_activity_task_body_bytes", max_activity_task_body_bytes)
    if not isinstance(session_lifetime, timedelta) or session_lifetime < timedelta(seconds=1):
        raise ValueError(f"session_lifetime must be a timedelta of at least a second, got {session_lifetime!r}")
    if (problem := docs_url_problem(docs_url)) is not None:
        raise ValueError(problem)
    if docs_dir is not None and not (Path(docs_dir) / "index.html").is_file():
        raise ValueError(f"docs_dir must be a built documentation site (no index.html in {os.fspath(docs_dir)!r})")
    engine = adapter_or_engine if isinstance(adapter_or_engine, Engine) else Engine(adapter_or_engine)
    signer = Signer.for_app(token)
    web = Web(engine, signer, docs_link=dashboard_docs_link(docs_url))
    service = activity_task_service if activity_task_service is not None else ActivityTaskService(engine)
    workflows = {name: definition.signature for name, definition in engine.registry.workflows.items()}
    operations = [*api.operations(workflows), *activity_tasks.operations(service), *extra_operations]
    openapi = document(operations, _version(), token=token is not None)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi)

    async def not_found(request: Request, exc: Exception) -> Response:
        if route_path(request.scope).startswith("/v1"):
            return error_response(
                ApiError(404, "NotFound", f"no API route {request.method} {route_path(request.scope)}")
            )
        return pages.not_found_page(request)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        # RFC 9110: a 405 says which methods the path does serve (the router's Allow header)
        allow = {"Allow": str((getattr(exc, "headers", None) or {}).get("Allow", ""))}
        if route_path(request.scope).startswith("/v1"):
            answer = error_response(ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed here"))
            answer.headers.update(allow)
            return answer
        return Response("method not allowed", status_code=405, headers=allow)

    app_routes: list[BaseRoute] = [
        Route("/v1/openapi.json", openapi_json, methods=["GET"]),
        *routes(operations, web),
        *pages.routes(web, token, signin_limiter or SignInLimiter(), session_lifetime),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        docs_mount(docs_dir),
    ]
    hosts = frozenset(h.lower() for h in allowed_hosts) | LOOPBACK_HOSTS if allowed_hosts else LOOPBACK_HOSTS
    app = Starlette(
        routes=app_routes,
        middleware=[
            Middleware(Guard, token=token, allowed_hosts=hosts, signer=signer),
            # inside the guard: a request it refuses is answered before any of its body is read
            Middleware(
                BodyLimit,
                default=max_body_bytes,
                limits=((ACTIVITY_TASKS, max_activity_task_body_bytes),),
            ),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
    )
    app.state.web = web
    app.state.operations = operations
    return app


def _version() -> str:
    try:
        return metadata.version("dex-engine")
    except metadata.PackageNotFoundError:
        return "0"
