"""A run's published values and streams under ``/v1``, as server-sent events
(docs/reference/contract.md §14).

``GET /v1/runs/{run_id}/streams/{key}`` sends each item of the stream as an ``item`` event (its
``id`` the item's position, its ``data`` the value as JSON), from the first or from after
``?after=`` / a ``Last-Event-ID`` header (a reconnecting browser resumes where it was), and an
``end`` event when the stream is closed or the run ends. ``GET /v1/runs/{run_id}/published/{key}``
sends the key's value as a ``value`` event (its ``id`` the number of publishes so far) each
time it changes, and ``end`` when the run ends. With ``?timeout=`` seconds, a quiet stream ends sooner, with an
``end`` event whose reason is ``timeout`` (a client then reconnects from where it was).

The routes read the store's port (never the history) and wait between reads on the same short
backoff as ``engine.read_stream`` (2 ms growing to 50 ms), sending a comment every 15 s so that
proxies keep the connection and a client that has gone is noticed. They never drive the engine:
a web app reads the database, it does not run workflows. An unknown run is a 404 before the
stream starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from dex.app.facade.streams import FIRST_PAUSE, MAX_PAUSE, PAGE, stream_key
from dex.app.ports.streams import PublishedRead, StreamPage
from dex.domain.errors import DexError
from dex.views.render import jsonable_payload
from dex.web import inputs
from dex.web.openapi import KEY
from dex.web.operations import Operation, Param, blocking

log = logging.getLogger("dex.web")
T = TypeVar("T")

KEEPALIVE = 15.0  # seconds between comments on a quiet stream
EVENT_STREAM = "text/event-stream"
MAX_POSITION = 2**62
MAX_TIMEOUT = 3600


def _run_id(request: Request) -> str:
    return inputs.checked(request.path_params["run_id"], "run_id")


def _event(kind: str, data: Any, event_id: int | None = None) -> bytes:
    lines = [f"event: {kind}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    # one line of JSON: ensure_ascii keeps every code point (a lone surrogate too) sendable
    lines.append(f"data: {json.dumps(data, ensure_ascii=True, allow_nan=False)}")
    return ("\n".join(lines) + "\n\n").encode("ascii")


def _after(request: Request) -> int:
    after = inputs.optional_integer(request.query_params, "after", 0, MAX_POSITION)
    if after is not None:
        return after
    last = request.headers.get("last-event-id", "").strip()
    if last.isascii() and last.isdigit() and int(last) <= MAX_POSITION:
        return int(last)
    return 0


def _sse(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(
        events, media_type=EVENT_STREAM, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


def _timeout(request: Request) -> float | None:
    seconds = inputs.optional_integer(request.query_params, "timeout", 0, MAX_TIMEOUT)
    return None if seconds is None else float(seconds)


class _Pause:
    """The backoff between reads of a quiet stream, when a keep-alive comment is due, and when
    the quiet has lasted the request's ``timeout``."""

    def __init__(self, timeout: float | None) -> None:
        self.pause = FIRST_PAUSE
        self.timeout = timeout
        self.quiet_since = self.kept_alive = time.monotonic()

    def heard(self) -> None:
        self.pause = FIRST_PAUSE
        self.quiet_since = self.kept_alive = time.monotonic()

    @property
    def timed_out(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.quiet_since >= self.timeout

    async def wait(self) -> bytes | None:
        await asyncio.sleep(self.pause)
        self.pause = min(self.pause * 1.5, MAX_PAUSE)
        if time.monotonic() - self.kept_alive >= KEEPALIVE:
            self.kept_alive = time.monotonic()
            return b": keep-alive\n\n"
        return None


async def _read(read: Callable[..., T], *args: Any) -> T | None:
    """A read of the store once the events have begun: a store that fails is read again with
    the backoff (logged), as ``engine.read_stream`` does; None once the run is gone."""
    pause = FIRST_PAUSE
    while True:
        try:
            return await blocking(read, *args)
        except DexError:
            return None
        except Exception as exc:  # noqa: BLE001 - the store failed (a connection, a timeout): read again
            log.info("an event stream's read failed (%s); reading again", type(exc).__name__)
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, MAX_PAUSE)


async def stream_events(request: Request, web: Any) -> Response:
    run_id, key, after = _run_id(request), stream_key(request.path_params["key"], "stream key"), _after(request)
    timeout = _timeout(request)
    first = await blocking(web.store.read_stream, run_id, key, after, PAGE)  # an unknown run: 404 here
    return _sse(_items(web, run_id, key, after, first, _Pause(timeout)))


async def _items(web: Any, run_id: str, key: str, after: int, page: StreamPage, pause: _Pause) -> AsyncIterator[bytes]:
    while True:
        for position, value in page.items:
            after = position
            yield _event("item", jsonable_payload(value), position)
        if page.items:
            pause.heard()
        elif page.closed or page.run_status.is_terminal:
            reason = "closed" if page.closed else "run ended"
            yield _event("end", {"reason": reason, "run_status": page.run_status.value})
            return
        elif pause.timed_out:  # the client reconnects with Last-Event-ID (or ?after=) to go on
            yield _event("end", {"reason": "timeout", "run_status": page.run_status.value})
            return
        else:
            comment = await pause.wait()
            if comment is not None:
                yield comment
        got = await _read(web.store.read_stream, run_id, key, after, PAGE)
        if got is None:
            return  # the run is gone (retention): nothing more will come
        page = got


async def published_events(request: Request, web: Any) -> Response:
    run_id, key = _run_id(request), stream_key(request.path_params["key"], "published value key")
    timeout = _timeout(request)
    first = await blocking(web.store.read_published, run_id, key)  # an unknown run: 404 here
    return _sse(_values(web, run_id, key, first, _Pause(timeout)))


async def _values(web: Any, run_id: str, key: str, found: PublishedRead, pause: _Pause) -> AsyncIterator[bytes]:
    version = 0
    while True:
        if found.version > version and found.value is not None:
            version = found.version
            pause.heard()
            yield _event("value", jsonable_payload(found.value), version)
        if found.run_status.is_terminal:
            yield _event("end", {"reason": "run ended", "run_status": found.run_status.value})
            return
        if pause.timed_out:
            yield _event("end", {"reason": "timeout", "run_status": found.run_status.value})
            return
        comment = await pause.wait()
        if comment is not None:
            yield comment
        got = await _read(web.store.read_published, run_id, key)
        if got is None:
            return
        found = got


SSE_DOC = {
    "type": "object",
    "description": "each server-sent event; comment lines keep a quiet connection open",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["item", "value", "end"]},
        "id": {"type": "string", "description": "an item's position; a value's number of publishes"},
        "data": {
            "type": "string",
            "description": "the value as JSON; for end, {reason (closed, run ended, timeout), run_status}",
        },
    },
}
KEY_PARAM = Param(name="key", where="path", schema=KEY, description="The key (1 to 256 characters)")
RUN = Param(name="run_id", where="path", description="The run's id")
TIMEOUT = Param(
    name="timeout",
    schema={"type": "integer", "minimum": 0, "maximum": MAX_TIMEOUT},
    description="End the events (reason timeout) after this many seconds without one; by default never",
)


def stream_operations() -> list[Operation]:
    """The ``/v1`` routes of published values and streams."""
    return [
        Operation(
            method="GET",
            path="/v1/runs/{run_id}/streams/{key}",
            handler=stream_events,
            summary="A run's stream as server-sent events: every item in order (from the first, or after "
            "?after= or Last-Event-ID), then an end event when the stream is closed or the run ends",
            params=(
                RUN,
                KEY_PARAM,
                Param(
                    name="after",
                    schema={"type": "integer", "minimum": 0, "maximum": MAX_POSITION},
                    description="Only items after this position (the id of the last item read)",
                ),
                TIMEOUT,
            ),
            response=SSE_DOC,
            media_type=EVENT_STREAM,
            errors=(400, 401, 404),
        ),
        Operation(
            method="GET",
            path="/v1/runs/{run_id}/published/{key}",
            handler=published_events,
            summary="A run's published value as server-sent events: the current value, then each new one, "
            "then an end event when the run ends",
            params=(RUN, KEY_PARAM, TIMEOUT),
            response=SSE_DOC,
            media_type=EVENT_STREAM,
            errors=(400, 401, 404),
        ),
    ]
