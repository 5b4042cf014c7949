"""The JSON API of queues, engines and schedules under ``/v1`` (docs/reference/contract.md §12): list queues, pause,
resume and size one, set its key concurrency and rate limit (§15); list the live engines (docs/reference/contract.md §15); list schedules, show one, pause, resume
and trigger one. Each is the engine's own call (``Engine.pause_queue``, ``Engine.list_engines``,
``Engine.trigger_schedule``, ...)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dex.app.ports.store import MAX_QUEUE_CAPACITY
from dex.domain.queue_limits import MAX_KEY_CONCURRENCY, MAX_RATE_COUNT
from dex.views.render import jsonable
from dex.web import inputs
from dex.web.errors import ApiError
from dex.web.openapi import NAME, QUEUE_NAME, RATE_LIMIT_DOC, TEXT, links, nullable, run_links
from dex.web.operations import Operation, Param, blocking, json

KIND = Param(name="kind", where="path", schema={"type": "string", "enum": ["workflow", "activity"]})
QUEUE = Param(name="name", where="path", schema=QUEUE_NAME, description="The queue's name")
SCHEDULE = Param(name="name", where="path", schema=NAME, description="The schedule's name")
QUEUE_DOC = {"$ref": "#/components/schemas/Queue"}
SCHEDULE_DOC = {"$ref": "#/components/schemas/Schedule"}
ENGINE_DOC = {"$ref": "#/components/schemas/Engine"}


def _queue(request: Request) -> tuple[str, str]:
    return inputs.checked(request.path_params["name"], "name"), inputs.checked(request.path_params["kind"], "kind")


async def _existing_queue(request: Request, web: Any) -> tuple[str, str]:
    """The queue the path names; a 404 if there is none (the store calls it a bad value)."""
    name, kind = _queue(request)
    if kind in ("workflow", "activity"):
        await blocking(web.queue, name, kind)
    return name, kind


async def list_queues(request: Request, web: Any) -> Response:
    queues = await blocking(web.engine.list_queues)
    return json({"queues": [jsonable(queue) for queue in queues]})


async def pause_queue(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    name, kind = await _existing_queue(request, web)
    await blocking(web.engine.pause_queue, name, kind)
    return json(await blocking(web.queue, name, kind))


async def resume_queue(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    name, kind = await _existing_queue(request, web)
    await blocking(web.engine.resume_queue, name, kind)
    return json(await blocking(web.queue, name, kind))


async def set_capacity(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    name, kind = await _existing_queue(request, web)
    capacity = inputs.whole_number(body, "capacity", 1, MAX_QUEUE_CAPACITY)
    if capacity is None:
        raise ApiError(422, "ValueError", "capacity (a positive integer) is required")
    await blocking(web.engine.set_queue_capacity, name, kind, capacity)
    return json(await blocking(web.queue, name, kind))


async def set_key_concurrency(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    name, kind = await _existing_queue(request, web)
    n = inputs.whole_number(body, "key_concurrency", 1, MAX_KEY_CONCURRENCY)
    if n is None:
        raise ApiError(422, "ValueError", "key_concurrency (a positive integer) is required")
    await blocking(web.engine.set_queue_key_concurrency, name, kind, n)
    return json(await blocking(web.queue, name, kind))


async def set_rate_limit(request: Request, web: Any) -> Response:
    """``{"rate_limit": {"starts": n, "period": seconds}}``, or ``{"rate_limit": null}`` to remove it."""
    body = await inputs.json_object(request)
    name, kind = await _existing_queue(request, web)
    if "rate_limit" not in body:
        raise ApiError(422, "ValueError", "rate_limit ({starts, period} or null) is required")
    given = inputs.field(body, "rate_limit", dict)
    rate = None
    if given is not None:
        starts = inputs.whole_number(given, "starts", 1, MAX_RATE_COUNT)
        period = inputs.field(given, "period", (int, float))
        if starts is None or period is None or isinstance(period, bool):
            raise ApiError(422, "ValueError", "a rate limit needs starts (an integer) and period (seconds)")
        rate = (starts, timedelta(seconds=period))  # out of range: the engine's ValueError, a 422
    await blocking(web.engine.set_queue_rate_limit, name, kind, rate)
    return json(await blocking(web.queue, name, kind))


async def list_engines(request: Request, web: Any) -> Response:
    engines = await blocking(web.engine.list_engines)
    return json({"engines": [jsonable(engine) for engine in engines]})


def _schedule(request: Request) -> str:
    return inputs.checked(request.path_params["name"], "name")


async def list_schedules(request: Request, web: Any) -> Response:
    schedules = await blocking(web.engine.list_schedules)
    return json({"schedules": [jsonable(schedule) for schedule in schedules]})


async def get_schedule(request: Request, web: Any) -> Response:
    return json(jsonable(await blocking(web.engine.get_schedule, _schedule(request))))


async def pause_schedule(request: Request, web: Any) -> Response:
    body = await inputs.json_object(request)
    name = _schedule(request)
    await blocking(web.engine.pause_schedule, name, inputs.field(body, "note", str, ""))
    return json(jsonable(await blocking(web.engine.get_schedule, name)))


async def resume_schedule(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    name = _schedule(request)
    await blocking(web.engine.resume_schedule, name)
    return json(jsonable(await blocking(web.engine.get_schedule, name)))


async def trigger_schedule(request: Request, web: Any) -> Response:
    await inputs.json_object(request)
    new_id = await blocking(web.engine.trigger_schedule, _schedule(request))
    return json({"run_id": new_id}, status=201)


def admin_operations() -> list[Operation]:
    queue_path = "/v1/queues/{kind}/{name}"
    schedule_path = "/v1/schedules/{name}"
    return [
        Operation(
            method="GET",
            path="/v1/queues",
            handler=list_queues,
            summary="Every queue: kind, status, capacity, depth, key concurrency and rate limit",
            response={"type": "object", "properties": {"queues": {"type": "array", "items": QUEUE_DOC}}},
            tag="queues",
            links=links(
                (
                    ("PauseQueue", "POST", queue_path + "/pause"),
                    ("ResumeQueue", "POST", queue_path + "/resume"),
                    ("SetCapacity", "POST", queue_path + "/capacity"),
                    ("SetKeyConcurrency", "POST", queue_path + "/key-concurrency"),
                    ("SetRateLimit", "POST", queue_path + "/rate-limit"),
                ),
                kind="$response.body#/queues/0/kind",
                name="$response.body#/queues/0/name",
            ),
        ),
        Operation(
            method="POST",
            path=queue_path + "/pause",
            handler=pause_queue,
            summary="Pause a queue: its tasks are not claimed until it is resumed",
            params=(KIND, QUEUE),
            response=QUEUE_DOC,
            tag="queues",
        ),
        Operation(
            method="POST",
            path=queue_path + "/resume",
            handler=resume_queue,
            summary="Resume a paused queue",
            params=(KIND, QUEUE),
            response=QUEUE_DOC,
            tag="queues",
        ),
        Operation(
            method="POST",
            path=queue_path + "/capacity",
            handler=set_capacity,
            summary="Set how many of a queue's tasks may run at once",
            params=(KIND, QUEUE),
            body={
                "type": "object",
                "required": ["capacity"],
                "properties": {"capacity": {"type": "integer", "minimum": 1, "maximum": MAX_QUEUE_CAPACITY}},
            },
            response=QUEUE_DOC,
            tag="queues",
        ),
        Operation(
            method="POST",
            path=queue_path + "/key-concurrency",
            handler=set_key_concurrency,
            summary="Set how many runs sharing a concurrency key may run at once, granted by this queue",
            params=(KIND, QUEUE),
            body={
                "type": "object",
                "required": ["key_concurrency"],
                "properties": {"key_concurrency": {"type": "integer", "minimum": 1, "maximum": MAX_KEY_CONCURRENCY}},
            },
            response=QUEUE_DOC,
            tag="queues",
        ),
        Operation(
            method="POST",
            path=queue_path + "/rate-limit",
            handler=set_rate_limit,
            summary="Let at most `starts` of a queue's tasks start in any window of `period` seconds (null: no limit)",
            params=(KIND, QUEUE),
            body={
                "type": "object",
                "required": ["rate_limit"],
                "properties": {"rate_limit": nullable(RATE_LIMIT_DOC)},
            },
            response=QUEUE_DOC,
            tag="queues",
        ),
        Operation(
            method="GET",
            path="/v1/engines",
            handler=list_engines,
            summary="The live engines: host, pid, code version, registered names, queues, last seen",
            response={"type": "object", "properties": {"engines": {"type": "array", "items": ENGINE_DOC}}},
            tag="engines",
        ),
        Operation(
            method="GET",
            path="/v1/schedules",
            handler=list_schedules,
            summary="Every schedule, with its next fire and last run",
            response={"type": "object", "properties": {"schedules": {"type": "array", "items": SCHEDULE_DOC}}},
            tag="schedules",
            links=links(
                (
                    ("GetSchedule", "GET", schedule_path),
                    ("PauseSchedule", "POST", schedule_path + "/pause"),
                    ("ResumeSchedule", "POST", schedule_path + "/resume"),
                    ("TriggerSchedule", "POST", schedule_path + "/trigger"),
                ),
                name="$response.body#/schedules/0/name",
            ),
        ),
        Operation(
            method="GET",
            path=schedule_path,
            handler=get_schedule,
            summary="A schedule",
            params=(SCHEDULE,),
            response=SCHEDULE_DOC,
            tag="schedules",
        ),
        Operation(
            method="POST",
            path=schedule_path + "/pause",
            handler=pause_schedule,
            summary="Pause a schedule (fires due while paused are skipped)",
            params=(SCHEDULE,),
            body={"type": "object", "properties": {"note": nullable(TEXT)}},
            response=SCHEDULE_DOC,
            tag="schedules",
        ),
        Operation(
            method="POST",
            path=schedule_path + "/resume",
            handler=resume_schedule,
            summary="Resume a paused schedule",
            params=(SCHEDULE,),
            response=SCHEDULE_DOC,
            tag="schedules",
        ),
        Operation(
            method="POST",
            path=schedule_path + "/trigger",
            handler=trigger_schedule,
            summary="Start one run of a schedule now, whatever its pause and overlap",
            params=(SCHEDULE,),
            response={"type": "object", "properties": {"run_id": {"type": "string"}}},
            status=201,
            tag="schedules",
            links=run_links(),
        ),
    ]
