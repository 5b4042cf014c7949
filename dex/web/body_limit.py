"""How large a request body may be, enforced while it streams in, for every route.

A handler that reads its body with ``await request.body()`` holds all of it before it can
look at its size, and a chunked body has no ``Content-Length`` to look at first: a client could
make the process hold a body as large as it cares to send. ``BodyLimit`` is an ASGI middleware
around the whole app, so every route (the API, the pages' forms, the remote workers'
``/v1/activity-tasks``, a route added later) is covered in one place:

- a declared ``Content-Length`` over the limit is answered 413 before the app is called (no
  byte of the body is read);
- otherwise it counts the bytes of each ``http.request`` message as the app receives them, and
  as soon as they pass the limit it answers 413 itself and ends the app's reading with
  :class:`BodyTooLarge`: the process holds at most the limit plus one message of the server.

Whatever the app sends after that (its own answer to the interrupted read) is dropped: the
client has its 413. ``BodyTooLarge`` is a ``BaseException`` so that handlers' ``except
Exception`` (which log what they catch as a fault of dex) let it pass to here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 1 << 20  # bytes: a JSON body or a form of the API and the pages (1 MiB)
# the remote workers' calls carry a result or a failure: a payload of up to the service's
# max_payload_size (2 MiB by default) as JSON text, whose escapes can make it several times larger
DEFAULT_MAX_ACTIVITY_TASK_BODY = 8 << 20
ACTIVITY_TASKS = "/v1/activity-tasks/"


def check_limit(name: str, size: int) -> int:
    """``size`` if it is a limit (an int of bytes, 0 or more); a ValueError naming ``name`` if not."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"{name} must be a non-negative int (bytes), got {size!r}")
    return size


class BodyTooLarge(BaseException):
    """Raised into the app when its request body passed the limit (the 413 is already sent)."""


class BodyLimit:
    """The ASGI middleware of the module docstring: ``limits`` are (path prefix, bytes) pairs,
    the first matching prefix wins; ``default`` is the limit of every other path."""

    def __init__(self, app: ASGIApp, default: int, limits: Sequence[tuple[str, int]] = ()) -> None:
        check_limit("default", default)
        for prefix, size in limits:
            check_limit(prefix, size)
        self.app, self.default, self.limits = app, default, tuple(limits)

    def limit_for(self, path: str) -> int:
        return next((size for prefix, size in self.limits if path.startswith(prefix)), self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root = str(scope.get("root_path", "")).rstrip("/")
        path: str = scope.get("path", "")
        limit = self.limit_for(path[len(root) :] if root and path.startswith(root) else path)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, limit)
            return
        state = _Request()

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state.received += len(message.get("body", b""))
                if state.received > limit:
                    if not state.started:
                        state.refused = True
                        await _too_large(send, limit)
                    raise BodyTooLarge(f"the request body passed {limit} bytes")
            return message

        async def tracked_send(message: Message) -> None:
            if state.refused:
                return  # the client has its 413; the app's answer to the broken read is dropped
            if message["type"] == "http.response.start":
                state.started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state.ended = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge:
            if state.started and not state.ended and not state.refused:  # its answer had begun: end it
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Request:
    """What the middleware knows of one request so far."""

    def __init__(self) -> None:
        self.received = 0
        self.started = False  # the app sent its response's start
        self.ended = False  # ... and its last body message
        self.refused = False  # the middleware sent the 413


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            if not text.isdigit():
                return None  # the server refuses a malformed length; counting still holds
            return int(text[:20])  # 20 digits exceed any limit: no need to read more of them
    return None


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        {"error": {"type": "PayloadTooLarge", "message": f"the request body is larger than {limit} bytes"}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the rest of the body is not read: this connection is done
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
