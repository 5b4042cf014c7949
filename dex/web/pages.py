"""The dashboard's pages (docs/reference/contract.md §12): overview, runs, a run, queues, workers, schedules,
and sign-in.

Pages are Jinja2 templates with autoescaping on: every name, label, payload, message and
stack trace goes through it, so a label ``<script>…`` is shown as text. Actions are plain
form posts (checked for the same origin by :mod:`dex.web.security`) that redirect back with a
note of what was done (signed: a page shows a note only if this app wrote it, so a link cannot
make the dashboard say anything); a few lines of our own JavaScript (``static/dex.js``) ask for
confirmation and refresh the runs table, and nothing is loaded from the network.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from dex.views.render import (
    rate_text,
    show_duration,
    show_labels,
    show_schedule_status,
    show_schedule_timing,
    show_time,
)
from dex.web import actions, inputs
from dex.web.errors import classify
from dex.web.insights import MAX_CHILDREN_COUNTED
from dex.web.listing import LEVELS, STATUSES, page_of_runs, query_string, run_query
from dex.web.operations import blocking
from dex.web.published_view import published_view
from dex.web.run_view import run_view
from dex.web.security import (
    COOKIE,
    DEFAULT_SESSION_LIFETIME,
    root_of,
    route_path,
    safe_next,
    session_cookie,
    token_matches,
)
from dex.web.signin_limit import SignInLimiter
from dex.web.signing import Signer

TEMPLATES = Path(__file__).parent / "templates"
ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True), auto_reload=False)
ENV.filters["time"] = lambda moment: show_time(moment)
ENV.filters["moment"] = lambda moment: show_time(moment, millis=True)
ENV.filters["labels"] = show_labels
ENV.filters["schedule_timing"] = show_schedule_timing  # the words of `dex schedules list`
ENV.filters["schedule_status"] = show_schedule_status
# a run id in a narrow cell: its start and its end (ids made in one millisecond share their
# start, so the end tells them apart); the whole id is the link's title
ENV.filters["short_id"] = lambda run_id: run_id if len(run_id) <= 16 else f"{run_id[:8]}…{run_id[-6:]}"
ENV.filters["took"] = lambda run: show_duration(run.completed_at - run.created_at) if run.completed_at else "-"


NOTE = "page note"  # the signing purpose of the notes actions leave


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    body = ENV.get_template(name).render(
        request=request,
        root=root_of(request.scope),
        path=route_path(request.scope),
        note=_note(request),
        docs=request.app.state.web.docs_link,
        **context,
    )
    return HTMLResponse(body, status_code=status)


def _note(request: Request) -> str | None:
    """The note of ``?done=`` if this app signed it (``&sig=``), else none."""
    done, signature = request.query_params.get("done"), request.query_params.get("sig")
    if not done or not signature or len(done) > 2000:
        return None
    return done if request.app.state.web.signer.verify(NOTE, done, signature) else None


def note_query(signer: Signer, done: str) -> str:
    """The query string that makes the next page show ``done``."""
    return f"done={quote(done)}&sig={signer.signature(NOTE, done)}"


def not_found_page(request: Request, message: str = "There is no such page.") -> Response:
    return render(request, "error.html", status=404, title="Not found", message=message)


def guarded(handler: Any) -> Any:
    """A page handler whose errors become an error page with the fitting status code."""

    async def page(request: Request) -> Response:
        try:
            response: Response = await handler(request)
            return response
        except BaseException as exc:  # noqa: BLE001 - shown; classify re-raises PASS_THROUGH
            error = classify(exc)
            return render(request, "error.html", status=error.status, title=error.kind, message=error.message)

    return page


async def overview(request: Request) -> Response:
    web = request.app.state.web
    view = await blocking(actions.overview, web, web.store.clock.now())  # a virtual clock too
    return render(request, "overview.html", **view)


async def runs(request: Request) -> Response:
    return render(request, "runs.html", **(await _runs_view(request)))


async def runs_table(request: Request) -> Response:
    return render(request, "runs_table.html", **(await _runs_view(request)))


async def _runs_view(request: Request) -> dict[str, Any]:
    web = request.app.state.web
    query = run_query(request.query_params, web.signer)
    page, cursor = await blocking(page_of_runs, web.store, query)
    children = await blocking(web.insights.child_counts, [run.run_id for run in page])
    params = request.query_params
    filters = {
        "workflow": params.get("workflow", ""),
        "status": [s for s in params.getlist("status") if s],
        "label": [s for s in params.getlist("label") if s],
        "instance_id": params.get("instance_id", ""),
        "code_version": params.get("code_version", ""),
        "created_after": params.get("created_after", ""),
        "created_before": params.get("created_before", ""),
        "parent_run_id": params.get("parent_run_id", ""),
        "level": params.get("level", ""),
        "limit": params.get("limit", ""),
    }
    here = query_string(filters)
    return {
        "runs": page,
        "children": {run_id: _children(count) for run_id, count in children.items()},
        "nested": query.filter.top_level,  # top-level runs only: say so, and how to see the rest
        "parent": query.filter.parent_run_id,
        "filtered": any(value for key, value in filters.items() if key not in ("level", "limit")),
        "all_levels": query_string({**filters, "level": "all"}),
        "label_query": lambda key, value: query_string({**filters, "label": [f"{key}={value}"]}),
        "filters": filters,
        "statuses": STATUSES,
        "levels": LEVELS,
        "here": here,
        # the refresh reloads this very page (the same cursor), not the first one
        "refresh": query_string({**filters, "cursor": params.get("cursor", "")}),
        "next_page": query_string({**filters, "cursor": cursor.encode(web.signer)}) if cursor else None,
        "first_page": query.cursor is not None,
    }


def _children(count: int) -> str:
    """A run's children as the runs list counts them ("1000+" past the most counted)."""
    shown = f"{MAX_CHILDREN_COUNTED}+" if count > MAX_CHILDREN_COUNTED else str(count)
    return f"{shown} child" if count == 1 else f"{shown} children"


async def run_page(request: Request) -> Response:
    web = request.app.state.web
    run_id = inputs.checked(request.path_params["run_id"], "run_id")
    start = inputs.optional_integer(request.query_params, "from", 0, inputs.MAX_SEQ)  # a sequence number
    view = await blocking(run_view, web, run_id, web.store.clock.now(), start)
    # what it published and streamed, followed live by the page's script (docs/reference/contract.md §14)
    view.update(await blocking(published_view, web.store, run_id, root_of(request.scope)))
    return render(request, "run.html", **view)


async def queues(request: Request) -> Response:
    web = request.app.state.web
    return render(request, "queues.html", queues=await blocking(web.engine.list_queues), rate_text=rate_text)


async def workers(request: Request) -> Response:
    """The live engines (docs/reference/contract.md §15): which processes serve which queues."""
    web = request.app.state.web
    return render(request, "workers.html", engines=await blocking(web.engine.list_engines))


async def schedules(request: Request) -> Response:
    web = request.app.state.web
    return render(request, "schedules.html", schedules=await blocking(web.engine.list_schedules))


async def act(request: Request) -> Response:
    """A form post: do the action, then back to the page it came from with a note."""
    web = request.app.state.web
    fields = await inputs.form(request)
    params = {k: inputs.checked(v, k) for k, v in request.path_params.items()}
    try:
        done, back = await blocking(actions.perform, web, route_path(request.scope), params, fields)
    except BaseException as exc:  # noqa: BLE001 - shown with its status; classify re-raises PASS_THROUGH
        error = classify(exc)
        return render(request, "error.html", status=error.status, title=error.kind, message=error.message)
    return RedirectResponse(f"{root_of(request.scope)}{back}?{note_query(web.signer, done)}", status_code=303)


def routes(
    web: Any, token: str | None, limiter: SignInLimiter, session_lifetime: timedelta = DEFAULT_SESSION_LIFETIME
) -> list[BaseRoute]:
    """The pages' routes; the sign-in form checks ``token`` under ``limiter`` and gives out
    sessions of ``session_lifetime``."""

    async def signin_form(request: Request) -> Response:
        return render(request, "signin.html", next=safe_next(request.query_params.get("next")), failed=False)

    async def signin(request: Request) -> Response:
        client = request.client.host if request.client else "unknown"
        wait = limiter.retry_after(client)
        if token is not None and wait is not None:  # checked before the form is read: no guess counts
            held = render(request, "signin.html", status=429, next="/", failed=False, wait=wait)
            held.headers["Retry-After"] = str(wait)
            return held
        fields = await inputs.form(request)
        target = safe_next(fields.get("next"))
        root = root_of(request.scope)
        if token is None:
            return RedirectResponse(root + target, status_code=303)
        if not token_matches(fields.get("token", ""), token):
            limiter.failed(client)
            return render(request, "signin.html", status=401, next=target, failed=True)
        limiter.succeeded(client)
        response = RedirectResponse(root + target, status_code=303)
        response.set_cookie(
            COOKIE,
            session_cookie(web.signer, time.time(), session_lifetime),
            max_age=max(1, int(session_lifetime.total_seconds())),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",  # behind TLS, never sent in the clear
            path=root + "/",
        )
        return response

    async def signout(request: Request) -> Response:
        root = root_of(request.scope)
        response = RedirectResponse(root + "/signin", status_code=303)
        response.delete_cookie(COOKIE, path=root + "/")
        return response

    post = ["POST"]
    return [
        Route("/", guarded(overview)),
        Route("/runs", guarded(runs)),
        Route("/runs/table", guarded(runs_table)),
        Route("/runs/{run_id}", guarded(run_page)),
        Route("/runs/{run_id}/{action:str}", guarded(act), methods=post),
        Route("/queues", guarded(queues)),
        Route("/queues/{kind}/{name}/{action:str}", guarded(act), methods=post),
        Route("/workers", guarded(workers)),
        Route("/schedules", guarded(schedules)),
        Route("/schedules/{name}/{action:str}", guarded(act), methods=post),
        Route("/signin", guarded(signin_form)),
        Route("/signin", guarded(signin), methods=post),
        Route("/signout", guarded(signout), methods=post),
    ]
