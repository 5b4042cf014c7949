"""A request body is bounded while it streams in, on every route: a body over the limit is a
413 as soon as the limit is passed (a declared length at once, without reading a byte), and the
app has read at most the limit plus one message of it. Healthy requests go on."""

from __future__ import annotations

import asyncio
import json
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

import dex
from dex.web import create_app
from dex.web.body_limit import DEFAULT_MAX_ACTIVITY_TASK_BODY, DEFAULT_MAX_BODY
from tests.web.conftest import client
from tests.web.test_browser import serve
from tests.web.test_poison import healthy_run_completes

LIMIT = 64 * 1024
CHUNK = 16 * 1024
HUGE = 200 * 1024 * 1024  # what a hostile client offers: far more than the limit

ROUTES = (
    ("/v1/runs", b"application/json"),  # the JSON API
    ("/v1/runs/some-run/events", b"application/json"),
    ("/v1/queues/workflow/default/capacity", b"application/json"),
    ("/runs/some-run/cancel", b"application/x-www-form-urlencoded"),  # a page's form
    ("/signin", b"application/x-www-form-urlencoded"),
    ("/v1/activity-tasks/poll", b"application/json"),  # the remote workers' routes
    ("/v1/activity-tasks/1/complete", b"application/json"),
    ("/v1/no-such-route", b"application/json"),
)


class Body:
    """A request body offered in chunks, as a server hands them to the app; counts what was read."""

    def __init__(self, total: int, chunk: int = CHUNK) -> None:
        self.total, self.chunk, self.read = total, chunk, 0

    def messages(self) -> Iterator[dict[str, Any]]:
        while self.read < self.total:
            size = min(self.chunk, self.total - self.read)
            self.read += size
            yield {"type": "http.request", "body": b"{" + b" " * (size - 1), "more_body": self.read < self.total}


def call(app: Any, path: str, content_type: bytes, body: Body, declared: int | None = None) -> tuple[int, bytes]:
    """``app`` called as a server calls it: POST ``path`` with ``body``, chunked unless ``declared``."""
    headers = [(b"host", b"127.0.0.1:8765"), (b"content-type", content_type)]
    headers.append(
        (b"content-length", str(declared).encode()) if declared is not None else (b"transfer-encoding", b"chunked")
    )
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
    }
    messages = body.messages()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent  # one answer, never the app's own after the refusal
    return starts[0]["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.mark.parametrize(("path", "content_type"), ROUTES)
def test_a_chunked_body_over_the_limit_is_a_413_once_the_limit_is_passed(
    engine: dex.Engine, path: str, content_type: bytes
) -> None:
    app = create_app(engine, max_body_bytes=LIMIT, max_activity_task_body_bytes=LIMIT)
    body = Body(HUGE)
    status, answer = call(app, path, content_type, body)
    if path == "/v1/no-such-route":  # nothing reads a body no route takes: a 404, nothing read
        assert (status, body.read) == (404, 0)
        return
    assert status == 413
    assert json.loads(answer)["error"]["type"] == "PayloadTooLarge"
    assert str(LIMIT) in json.loads(answer)["error"]["message"]
    assert body.read <= LIMIT + CHUNK  # the app held at most the limit and one more message
    with client(app) as http:
        healthy_run_completes(engine, http)


@pytest.mark.parametrize(("path", "content_type"), ROUTES[:-1])
def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(
    engine: dex.Engine, path: str, content_type: bytes
) -> None:
    app = create_app(engine, max_body_bytes=LIMIT, max_activity_task_body_bytes=LIMIT)
    body = Body(HUGE)
    status, answer = call(app, path, content_type, body, declared=HUGE)
    assert status == 413 and json.loads(answer)["error"]["type"] == "PayloadTooLarge"
    assert body.read == 0
    with client(app) as http:
        healthy_run_completes(engine, http)


def test_a_body_within_the_limit_is_read_whole_chunked_or_not(engine: dex.Engine) -> None:
    app = create_app(engine, max_body_bytes=LIMIT)
    start = json.dumps({"workflow": "web-checkout", "args": [5], "labels": {"pad": "x" * (LIMIT - 200)}}).encode()
    assert len(start) <= LIMIT
    with client(app) as http:

        def chunks() -> Iterator[bytes]:
            for at in range(0, len(start), 1000):
                yield start[at : at + 1000]

        chunked = http.post("/v1/runs", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 201, chunked.text
        plain = http.post("/v1/runs", content=start, headers={"content-type": "application/json"})
        assert plain.status_code == 201, plain.text
        engine.drain()
        for response in (chunked, plain):
            assert http.get(f"/v1/runs/{response.json()['run_id']}").json()["status"] == "COMPLETED"


def test_the_activity_task_routes_have_their_own_larger_limit(engine: dex.Engine) -> None:
    app = create_app(engine)  # the defaults: 1 MiB for the API, 8 MiB for the remote workers
    assert DEFAULT_MAX_BODY < DEFAULT_MAX_ACTIVITY_TASK_BODY
    between = Body(2 * DEFAULT_MAX_BODY)
    status, _ = call(app, "/v1/activity-tasks/1/complete", b"application/json", between)
    assert status == 400 and between.read == 2 * DEFAULT_MAX_BODY  # read whole, then refused as not JSON
    status, _ = call(app, "/v1/runs", b"application/json", Body(2 * DEFAULT_MAX_BODY))
    assert status == 413
    over = Body(HUGE, chunk=1 << 20)
    status, _ = call(app, "/v1/activity-tasks/1/complete", b"application/json", over)
    assert status == 413 and over.read <= DEFAULT_MAX_ACTIVITY_TASK_BODY + (1 << 20)


def test_a_request_the_guard_refuses_has_none_of_its_body_read(engine: dex.Engine) -> None:
    app = create_app(engine, token="s3cret-token", max_body_bytes=LIMIT)
    body = Body(HUGE)
    status, _ = call(app, "/v1/runs", b"application/json", body)
    assert (status, body.read) == (401, 0)


@pytest.mark.parametrize("bad", [-1, "1024", 1.5, True, None])
def test_a_limit_that_is_no_byte_count_is_refused_when_the_app_is_made(engine: dex.Engine, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(engine, max_body_bytes=bad)
    with pytest.raises(ValueError, match="max_activity_task_body_bytes"):
        create_app(engine, max_activity_task_body_bytes=bad)


def test_over_a_real_socket_the_413_comes_while_the_client_is_still_sending(engine: dex.Engine) -> None:
    """uvicorn on 127.0.0.1: the client offers 200 MB chunked; the answer is a 413 long before
    that is sent (the server stopped reading), and the server goes on serving."""
    app = create_app(engine, max_body_bytes=LIMIT)
    with serve(app) as base:
        port = int(base.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        head = b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        pending = head + b"Transfer-Encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n%s\r\n" % (CHUNK, b" " * CHUNK)
        sent, answer = 0, b""
        try:
            while b"\r\n\r\n" not in answer and sent < HUGE:
                readable, writable, _ = select.select([sock], [sock], [], 10)
                assert readable or writable, "the server neither answered nor read"
                if readable:
                    data = sock.recv(65536)
                    if not data:
                        break
                    answer += data
                elif writable:
                    if not pending:
                        pending = chunk
                    try:
                        done = sock.send(pending)
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    sent += done
                    pending = pending[done:]
            sock.setblocking(True)
            sock.settimeout(10)
            while b"\r\n\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < HUGE // 4  # the rest was never taken: the server did not read on to the end
        with client(app) as http:
            healthy_run_completes(engine, http)
