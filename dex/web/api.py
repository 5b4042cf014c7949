"""The JSON API of runs under ``/v1`` (docs/reference/contract.md §12): list, get, history, activity steps, start,
cancel, terminate, suspend, resume, fork and send an event. Queues and schedules are :mod:`dex.web.api_admin`.

Reads go through the store's ports and are shown as the command line shows them (payloads
decoded without the workflows' type hints; :mod:`dex.web.listing`); changes go through the
engine's public calls, which check every value as they do for any caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dex.app.facade.steps import steps_in
from dex.domain import events as ev
from dex.domain.definitions import Signature
from dex.domain.errors import NotRegisteredError
from dex.domain.instance_keys import ID_REUSE
from dex.views.attempts import step_json
from dex.web import inputs
from dex.web.api_admin import admin_operations
from dex.web.api_streams import stream_operations
from dex.web.api_updates import update_operations
from dex.web.errors import ApiError, first_line
from dex.web.listing import LEVELS, event_document, page_of_runs, run_document, run_query
from dex.web.openapi import KEY, LABELS, NAME, PRIORITY, QUEUE_NAME, STATUSES, TEXT, links, nullable, run_links
from dex.web.operations import Operation, Param, blocking, json

MAX_HISTORY_PAGE = 10_000  # events in one page of a history
MAX_STEPS_PAGE = 500  # activity steps in one page of them
DEFAULT_STEPS_PAGE = 100
# the events one page of activity steps reads to find them (their outcomes are read after
# those: steps_in); a page of a run with few steps among many events may hold fewer than asked
STEPS_READ = 5_000
RUN_ID = Param(name="run_id", where="path", description="The run's id")
STRING = {"type": "string"}
RUN = {"$ref": "#/components/schemas/Run"}
REQUESTED = {"type": "object", "properties": {"run_id": STRING, "requested": {"enum": ["cancel", "suspend", "resume"]}}}
MOMENT = {"type": "string", "format": "date-time"}
FILTERS = (
    Param(name="workflow", schema=NAME, description="Only runs of this workflow"),
    Param(
        name="status",
        repeated=True,
        schema={"type": "string", "enum": [*STATUSES, *(status.lower() for status in STATUSES), ""]},
        description="Only runs in this status (repeatable; upper or lower case; a blank one is ignored)",
    ),
    Param(
        name="label",
        repeated=True,
        schema={"type": "string", "pattern": "^([^=\\x00]+=[^\\x00]*)?$"},
        description="KEY=VALUE: only runs with this label (repeatable; all must match; a blank one is ignored)",
    ),
    Param(name="instance_id", schema=TEXT, description="Only runs with this instance id"),
    Param(
        name="parent_run_id",
        schema=TEXT,
        description="Only the children of this run (the runs it started with ctx.child), whatever level is",
    ),
    Param(
        name="level",
        schema={"type": "string", "enum": [*LEVELS, ""], "default": "top"},
        description="top (the default): only top-level runs, no run's child; all: runs at every level. "
        "Ignored with parent_run_id",
    ),
    Param(
        name="code_version",
        schema={**TEXT, "maxLength": 256},
        description="Only runs started by engines of this code version",
    ),
    Param(name="created_after", schema=MOMENT, description="Only runs created after this time (RFC 3339)"),
    Param(name="created_before", schema=MOMENT, description="Only runs created before this time (RFC 3339)"),
    Param(name="limit", schema={"type": "integer", "minimum": 1, "maximum": inputs.MAX_PAGE, "default": 50}),
    Param(
        name="cursor",
        schema={**TEXT, "maxLength": 400},
        description="next_cursor of the previous page, as given (another is a 400)",
    ),
)


def run_id(request: Request) -> str:
    return inputs.checked(request.path_params["run_id"], "run_id")


async def list_runs(request: Request, web: Any) -> Response:
    query = run_query(request.query_params, web.signer)
    page, cursor = await blocking(page_of_runs, web.store, query)
    next_cursor = cursor.encode(web.signer) if cursor else None
    return json({"runs": [run_document(r) for r in page], "next_cursor": next_cursor})


async def get_run(request: Request, web: Any) -> Response:
    """The run: one row (its activity steps are a paged call of their own, :func:`activity_steps`)."""
    return json(run_document(await blocking(web.record, run_id(request))))


async def activity_steps(request: Request, web: Any) -> Response:
    params = request.query_params
    after = inputs.optional_integer(params, "after", 0, inputs.MAX_SEQ) or 0
    limit = inputs.optional_integer(params, "limit", 1, MAX_STEPS_PAGE) or DEFAULT_STEPS_PAGE
    return json(await blocking(steps_page, web, run_id(request), after, limit))


def steps_page(web: Any, run_id: str, after: int, limit: int) -> dict[str, Any]:
    """At most ``limit`` of the run's activity steps scheduled after event ``after``, with their
    attempts, found among at most :data:`STEPS_READ` events after it, and ``next_after`` (null
    once the history is read to its end). Bounded reads only, whatever the history's length;
    each step's outcome is looked for as :func:`~dex.app.facade.steps.steps_in` does, at most
    :data:`~dex.app.facade.steps.MAX_ENDINGS_READ` events on."""
    record = web.record(run_id)  # an unknown run is a 404
    read = min(STEPS_READ, 4 * limit + 4)  # four events a step, when each is awaited in turn: one read
    stretch = web.store.load_history_after(run_id, after, read)
    if len(stretch) == read < STEPS_READ and _scheduled(stretch) < limit:
        stretch += web.store.load_history_after(run_id, stretch[-1].sequence_number, STEPS_READ - read)
        read = STEPS_READ
    created = [item.sequence_number for item in stretch if isinstance(item.event, ev.ActivityTaskCreated)]
    # as many events as were asked for: the history may go on after them
    next_after = stretch[-1].sequence_number if len(stretch) == read else None
    following: list[ev.HistoryEvent] = []
    if len(created) > limit:  # the page ends at its last step; the next begins after it
        next_after = created[limit - 1]
        cut = next(i for i, item in enumerate(stretch) if item.sequence_number > next_after)
        stretch, following = stretch[:cut], stretch[cut:]  # the rest read holds outcomes of its steps
    steps = steps_in(web.store, run_id, stretch, record.status.is_terminal, following=following) if stretch else []
    return {"activity_steps": [step_json(step) for step in steps], "next_after": next_after}


def _scheduled(stretch: list[ev.HistoryEvent]) -> int:
    return sum(isinstance(item.event, ev.ActivityTaskCreated) for item in stretch)


async def history(request: Request, web: Any) -> Response:
    """The whole history; with ``limit``, at most that many events after ``after`` (a sequence
    number) and ``next_after`` for the next page (null at the end)."""
    params = request.query_params
    after = inputs.optional_integer(params, "after", 0, inputs.MAX_SEQ)
    limit = inputs.optional_integer(params, "limit", 1, MAX_HISTORY_PAGE)
    if limit is None and after is None:
        events = await blocking(web.store.load_history, run_id(request))
    else:  # one more than asked for says whether a next page exists
        wanted = (limit if limit is not None else inputs.MAX_SEQ) + 1
        events = await blocking(web.store.load_history_after, run_id(request), after or 0, wanted)
    more = limit is not None and len(events) > limit
    events = events[:limit]
    return json(
        {
            "events": [event_document(item) for item in events],
            "next_after": events[-1].sequence_number if more else None,
        }
    )


async def start_run(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    name = inputs.field(body, "workflow", str)
    if name is None:
        raise ApiError(422, "ValueError", "workflow (the workflow's registered name) is required")
    args = inputs.field(body, "args", list, [])
    labels = inputs.field(body, "labels", dict)
    try:  # dex web has no workflow code: the run is made by name for the engines that have it
        new_id = await blocking(
            web.engine.start_by_name,
            name,
            args,
            instance_id=inputs.field(body, "instance_id", str),
            queue=inputs.field(body, "queue", str),
            priority=inputs.field(body, "priority", int, 0),
            concurrency_key=inputs.field(body, "concurrency_key", str),
            labels=labels,
            force=inputs.field(body, "force", bool, False),
            id_reuse=inputs.field(body, "id_reuse", str, "allow"),
            debounce=_seconds(body, "debounce_seconds"),
            debounce_max=_seconds(body, "debounce_max_seconds"),
        )
    except NotRegisteredError as exc:
        raise ApiError(422, "NotRegisteredError", str(exc)) from None
    return json({"run_id": new_id}, status=201)


def _seconds(body: Mapping[str, Any], name: str) -> timedelta | None:
    """A duration given in seconds (its range is the body's schema's, checked before the handler)."""
    value = inputs.field(body, name, (int, float))
    return timedelta(seconds=value) if value is not None else None


async def cancel(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    await blocking(web.engine.cancel, run_id(request), inputs.field(body, "reason", str, ""))
    return json({"run_id": run_id(request), "requested": "cancel"}, status=202)


async def terminate(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    await blocking(web.engine.terminate, run_id(request), inputs.field(body, "reason", str, ""))
    return json({"run_id": run_id(request), "terminated": True})


async def suspend(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    await blocking(web.engine.suspend, run_id(request))
    return json({"run_id": run_id(request), "requested": "suspend"}, status=202)


async def resume(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    await blocking(web.engine.resume, run_id(request))
    return json({"run_id": run_id(request), "requested": "resume"}, status=202)


async def send_event(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    event_id = inputs.field(body, "event_id", str)
    if event_id is None:
        raise ApiError(422, "ValueError", "event_id is required")
    await blocking(web.engine.send_event, run_id(request), event_id, body.get("payload"))
    return json({"run_id": run_id(request), "event_id": event_id}, status=202)


async def fork(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    source = run_id(request)
    await blocking(web.record, source)  # an unknown run is a 404 before anything else
    try:
        new_id = await blocking(
            web.engine.fork, source, at=inputs.field(body, "at", int), queue=inputs.field(body, "queue", str)
        )
    except ValueError as exc:  # the queue is checked at the door: this is `at`, which the run's history decides
        raise ApiError(409, "ValueError", first_line(exc)) from None
    return json({"run_id": new_id, "forked_from": source}, status=201)


# a debounce of at most ten years: any longer is a mistake, and far past it no datetime holds the start
DEBOUNCE = {"type": "number", "minimum": 0, "maximum": 10 * 366 * 24 * 3600}


def start_body(workflows: Mapping[str, Signature]) -> dict[str, Any]:
    """The body of ``POST /v1/runs``. An engine with workflows starts only those (by name), with
    as many arguments as each takes: the body names them and their arities. Without any (``dex
    web`` over a database) any workflow name is taken, its arguments checked by its code."""
    body: dict[str, Any] = {
        "type": "object",
        "required": ["workflow"],
        "properties": {
            "workflow": {**NAME, "enum": sorted(workflows)} if workflows else NAME,
            "args": {"type": "array", "description": "the workflow's arguments, as JSON"},
            "instance_id": nullable(KEY),
            "queue": nullable(QUEUE_NAME),
            "priority": nullable(PRIORITY),
            "concurrency_key": nullable(KEY),
            "labels": nullable(LABELS),
            "id_reuse": nullable(
                {
                    "type": "string",
                    "enum": list(ID_REUSE),
                    "description": "what an ended run's instance id means: allow (default) a new run; failed_only "
                    "a new run only if the last one did not succeed; never: the last run's id, whatever its end",
                }
            ),
            "debounce_seconds": nullable(
                {
                    **DEBOUNCE,
                    "description": "with an instance_id: start in this many seconds; a start of the id before then "
                    "replaces the arguments and moves the start again",
                }
            ),
            "debounce_max_seconds": nullable(
                {**DEBOUNCE, "description": "the latest a debounced run starts, in seconds after its first start"}
            ),
            "force": {
                "type": ["boolean", "null"],
                "description": "without code (dex web over a database): make the run even though no live engine "
                "registers the workflow (else a 422 naming it)",
            },
        },
    }
    # every alternative: a workflow's arity (with workflows) and one of the kinds of start, whose
    # fields go together (one anyOf: the document's schemas have no allOf)
    arities = [_arity(name, signature) for name, signature in sorted(workflows.items())] if workflows else [{}]
    body["anyOf"] = [_both(arity, kind) for arity in arities for kind in _START_KINDS]
    return body


# a plain start; one by an instance id under id_reuse; a debounced one (docs/reference/contract.md §15)
_NULL = {"type": "null"}
_START_KINDS: tuple[dict[str, Any], ...] = (
    {"properties": {"id_reuse": {"enum": ["allow", None]}, "debounce_seconds": _NULL, "debounce_max_seconds": _NULL}},
    {"required": ["instance_id"], "properties": {"instance_id": KEY, "debounce_max_seconds": _NULL}},
    {"required": ["instance_id", "debounce_seconds"], "properties": {"instance_id": KEY, "debounce_seconds": DEBOUNCE}},
)


def _both(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A schema that holds where both do (their properties' schemas and required fields joined)."""
    joined: dict[str, Any] = {"properties": {**first.get("properties", {}), **second.get("properties", {})}}
    required = [*first.get("required", ()), *second.get("required", ())]
    if required:
        joined["required"] = required
    return joined


def _arity(name: str, signature: Signature) -> dict[str, Any]:
    args: dict[str, Any] = {"type": "array", "minItems": signature.required}
    if not signature.accepts_varargs:
        args["maxItems"] = len(signature.parameters)
    return {
        "properties": {"workflow": {"enum": [name]}, "args": args},
        **({"required": ["args"]} if signature.required else {}),
    }


def operations(workflows: Mapping[str, Signature] | None = None) -> list[Operation]:
    """The ``/v1`` operations this module serves, then queues and schedules; ``workflows``
    those the app's engine registers (by name), which it alone can start."""
    runs: list[Operation] = [
        Operation(
            method="GET",
            path="/v1/runs",
            handler=list_runs,
            summary="List runs, newest first (keyset paging: pass next_cursor as cursor)",
            params=FILTERS,
            response={
                "type": "object",
                "properties": {"runs": {"type": "array", "items": RUN}, "next_cursor": {"type": ["string", "null"]}},
            },
            links={  # the first run's calls, and the next page (its cursor handed on as given)
                **run_links("$response.body#/runs/0/run_id"),
                **links((("NextPage", "GET", "/v1/runs"),), query={"cursor": "$response.body#/next_cursor"}),
            },
        ),
        Operation(
            method="POST",
            path="/v1/runs",
            handler=start_run,
            summary="Start a run of a registered workflow by name, with JSON arguments",
            body=start_body(workflows or {}),
            response={"type": "object", "properties": {"run_id": STRING}},
            status=201,
            links=run_links(),
        ),
        Operation(
            method="GET",
            path="/v1/runs/{run_id}",
            handler=get_run,
            summary="A run (its activity steps and their attempts: GET /v1/runs/{run_id}/activity-steps)",
            params=(RUN_ID,),
            response=RUN,
        ),
        Operation(
            method="GET",
            path="/v1/runs/{run_id}/activity-steps",
            handler=activity_steps,
            summary="A run's activity steps, oldest first, and their attempts (count, newest failures, next "
            "retry); paged with limit and after. A page reads a bounded stretch of the history: it may hold "
            "fewer steps than asked for, even none, with next_after set; follow next_after until it is null",
            params=(
                RUN_ID,
                Param(
                    name="after",
                    schema={"type": "integer", "minimum": 0, "maximum": inputs.MAX_SEQ},
                    description="Only steps scheduled after this sequence number (next_after of the previous page)",
                ),
                Param(
                    name="limit",
                    schema={"type": "integer", "minimum": 1, "maximum": MAX_STEPS_PAGE, "default": DEFAULT_STEPS_PAGE},
                    description="At most this many steps",
                ),
            ),
            response={
                "type": "object",
                "properties": {
                    "activity_steps": {"type": "array", "items": {"$ref": "#/components/schemas/ActivityStep"}},
                    "next_after": {
                        "type": ["integer", "null"],
                        "description": "after for the next page; null when the history has been read to its end",
                    },
                },
            },
            links=links(
                (("NextPage", "GET", "/v1/runs/{run_id}/activity-steps"),),
                query={"after": "$response.body#/next_after"},
                run_id="$request.path.run_id",
            ),
        ),
        Operation(
            method="GET",
            path="/v1/runs/{run_id}/history",
            handler=history,
            summary="A run's history, oldest first, payloads decoded; paged with limit and after",
            params=(
                RUN_ID,
                Param(
                    name="after",
                    schema={"type": "integer", "minimum": 0, "maximum": inputs.MAX_SEQ},
                    description="Only events after this sequence number (next_after of the previous page)",
                ),
                Param(
                    name="limit",
                    schema={"type": "integer", "minimum": 1, "maximum": MAX_HISTORY_PAGE},
                    description="At most this many events (without it: all of them)",
                ),
            ),
            response={
                "type": "object",
                "properties": {
                    "events": {"type": "array", "items": {"type": "object"}},
                    "next_after": {
                        "type": ["integer", "null"],
                        "description": "after for the next page; null when no event follows",
                    },
                },
            },
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/cancel",
            handler=cancel,
            summary="Ask a run to stop at its next await and end CANCELLED",
            params=(RUN_ID,),
            body={"type": "object", "properties": {"reason": nullable(TEXT)}},
            response=REQUESTED,
            status=202,
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/terminate",
            handler=terminate,
            summary="Stop a run at once: none of its code runs again, its pending steps are dropped, its "
            "children terminated; it ends TERMINATED (409 InvalidStateError if it has ended)",
            params=(RUN_ID,),
            body={"type": "object", "properties": {"reason": nullable(TEXT)}},
            response={"type": "object", "properties": {"run_id": STRING, "terminated": {"type": "boolean"}}},
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/suspend",
            handler=suspend,
            summary="Hold back a run's new events",
            params=(RUN_ID,),
            response=REQUESTED,
            status=202,
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/resume",
            handler=resume,
            summary="Release a suspended run's events",
            params=(RUN_ID,),
            response=REQUESTED,
            status=202,
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/events",
            handler=send_event,
            summary="Send an external event (any JSON payload) to a run",
            params=(RUN_ID,),
            body={
                "type": "object",
                "required": ["event_id"],
                "properties": {"event_id": NAME, "payload": {"description": "any JSON"}},
            },
            response={"type": "object", "properties": {"run_id": STRING, "event_id": STRING}},
            status=202,
        ),
        Operation(
            method="POST",
            path="/v1/runs/{run_id}/fork",
            handler=fork,
            summary="Fork a run: a new run with its history up to a workflow task (docs/reference/contract.md §11)",
            params=(RUN_ID,),
            body={
                "type": "object",
                "properties": {
                    "at": {
                        "type": ["integer", "null"],
                        "minimum": 1,
                        "maximum": inputs.MAX_SEQ,
                        "description": "the sequence number of a WorkflowTaskCompleted of its history, or 1 (the "
                        "start); by default the last workflow task; one that is not such a point is a 409",
                    },
                    "queue": nullable(QUEUE_NAME),
                },
            },
            response={"type": "object", "properties": {"run_id": STRING, "forked_from": STRING}},
            status=201,
            links=run_links(),
        ),
    ]
    return runs + update_operations() + stream_operations() + admin_operations()
