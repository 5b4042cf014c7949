"""What the remote-worker tests share: a workflow that calls activities no Python process
registers, an HTTP server (uvicorn in a thread) over a service's routes, and a JSON client."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette

import dex
from dex.remote import ActivityTaskService
from dex.remote.http_routes import activity_task_routes


@dex.workflow(name="remote-resize")
async def resize(ctx: dex.WorkflowContext, images: list[dict[str, Any]]) -> list[Any]:
    """Resizes each image in a remote worker, one after the other."""
    return [await ctx.activity("resize-image", image) for image in images]


@dex.workflow(name="remote-one")
async def one(ctx: dex.WorkflowContext, name: str, arg: Any, max_attempts: int = 3) -> Any:
    """Calls the remote activity ``name`` once (retried up to ``max_attempts``)."""
    retry = dex.RetryPolicy(max_attempts=max_attempts, initial_delay=0.01, max_delay=0.01)
    return await ctx.activity(name, arg, retry=retry)


@dex.workflow(name="remote-two")
async def two(ctx: dex.WorkflowContext, first: Any, second: Any) -> list[Any]:
    """Calls ``echo`` twice at once (two tasks in one poll)."""
    return list(await ctx.gather(ctx.activity("echo", first), ctx.activity("echo", second)))


WORKFLOWS = [resize, one, two]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def http_server(service: ActivityTaskService) -> Iterator[str]:
    """Serve the service's routes on a free loopback port; yields the base URL."""
    with app_server(Starlette(routes=activity_task_routes(service))) as url:
        yield url


@contextmanager
def app_server(app: Any) -> Iterator[str]:
    """Serve an ASGI app on a free loopback port; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def post(url: str, body: Any, *, raw: bytes | None = None, timeout: float = 30) -> tuple[int, Any]:
    """POST JSON; (status, decoded answer), error statuses included."""
    status, answer, _headers = call(url, body, raw=raw, timeout=timeout)
    return status, answer


def call(
    url: str, body: Any = None, *, raw: bytes | None = None, timeout: float = 30, method: str = "POST"
) -> tuple[int, Any, dict[str, str]]:
    """A JSON request (a GET without a body); (status, decoded answer, headers), error statuses included."""
    data = raw if raw is not None else None if method == "GET" else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)
