"""Published values and streams as server-sent events under /v1, on both adapters
(docs/reference/contract.md §14), and in the OpenAPI document."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dex
from dex.web import create_app
from tests.web.conftest import client


@dex.workflow(name="web-streamer")
async def streamer(ctx: dex.WorkflowContext, count: int) -> int:
    ctx.publish("stage", "streaming")
    for i in range(count):
        await ctx.write_stream("items", {"i": i, "text": "nul \x00 inside"})
    ctx.close_stream("items")
    await ctx.write_stream("open", "first")
    await ctx.wait_for_event("go")
    await ctx.write_stream("open", "second")
    ctx.publish("stage", "done")
    return count


@pytest.fixture
def engine(make_engine: Callable[..., dex.Engine]) -> dex.Engine:
    return make_engine([streamer])


@pytest.fixture
def http(engine: dex.Engine) -> Iterator[Any]:
    with client(create_app(engine)) as c:
        yield c


def events(text: str) -> list[dict[str, Any]]:
    """The server-sent events of a body: each as its fields, ``data`` parsed as JSON."""
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = json.loads(value) if name == "data" else value
        if fields:
            found.append(fields)
    return found


def test_a_closed_stream_is_sent_whole_then_ended(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(streamer, 3)
    engine.drain()
    answer = http.get(f"/v1/runs/{run_id}/streams/items")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    got = events(answer.text)
    assert [e["event"] for e in got] == ["item", "item", "item", "end"]
    assert [e["id"] for e in got[:3]] == ["1", "2", "3"]
    assert [e["data"] for e in got[:3]] == [{"i": i, "text": "nul \x00 inside"} for i in range(3)]
    assert got[-1]["data"] == {"reason": "closed", "run_status": "RUNNING"}
    # resumed after the second: by ?after= or by the browser's Last-Event-ID
    assert [e.get("id") for e in events(http.get(f"/v1/runs/{run_id}/streams/items?after=2").text)] == ["3", None]
    resumed = http.get(f"/v1/runs/{run_id}/streams/items", headers={"Last-Event-ID": "2"})
    assert [e.get("id") for e in events(resumed.text)] == ["3", None]


def test_a_stream_is_sent_live_while_the_run_goes_on(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(streamer, 1)
    engine.drain()
    with http.stream("GET", f"/v1/runs/{run_id}/streams/open") as answer:
        lines = answer.iter_lines()
        first = [next(lines) for _ in range(3)]
        assert first == ["event: item", "id: 1", 'data: "first"']
        engine.send_event(run_id, "go")  # the run writes the second item and ends
        engine.drain()
        rest = "\n".join(lines)
    got = events(rest)
    assert [e["data"] for e in got] == ["second", {"reason": "run ended", "run_status": "COMPLETED"}]


def test_published_values_are_sent_as_they_change_until_the_run_ends(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(streamer, 1)
    engine.drain()
    with http.stream("GET", f"/v1/runs/{run_id}/published/stage") as answer:
        lines = answer.iter_lines()
        assert [next(lines) for _ in range(3)] == ["event: value", "id: 1", 'data: "streaming"']
        engine.send_event(run_id, "go")
        engine.drain()
        got = events("\n".join(lines))
    assert [(e["event"], e["data"]) for e in got] == [
        ("value", "done"),
        ("end", {"reason": "run ended", "run_status": "COMPLETED"}),
    ]


def test_unknown_runs_and_bad_keys_are_answered_before_any_event(engine: dex.Engine, http: Any) -> None:
    for path in ("/v1/runs/nope/streams/items", "/v1/runs/nope/published/stage"):
        answer = http.get(path)
        assert answer.status_code == 404 and answer.json()["error"]["type"] == "RunNotFoundError"
    run_id = engine.start_workflow(streamer, 1)
    engine.send_event(run_id, "go")
    engine.drain()
    for bad in ("a%00b", "x" * 257):
        for kind in ("streams", "published"):
            answer = http.get(f"/v1/runs/{run_id}/{kind}/{bad}")
            assert answer.status_code == 400, (kind, bad, answer.text)
    # a lone surrogate's UTF-8 form is not UTF-8: the path decodes it as replacement characters,
    # a key like any other, of no stream of this (ended) run
    assert events(http.get(f"/v1/runs/{run_id}/streams/%ED%A0%80").text) == [
        {"event": "end", "data": {"reason": "run ended", "run_status": "COMPLETED"}}
    ]
    assert http.get(f"/v1/runs/{run_id}/streams/items?after=-1").status_code == 400
    # a healthy read afterwards
    assert [e["event"] for e in events(http.get(f"/v1/runs/{run_id}/streams/items").text)] == ["item", "end"]


def test_a_quiet_stream_ends_at_its_timeout_and_resumes_where_it_was(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(streamer, 1)
    engine.drain()
    first = events(http.get(f"/v1/runs/{run_id}/streams/open?timeout=0").text)
    assert [(e["event"], e.get("id")) for e in first] == [("item", "1"), ("end", None)]
    assert first[-1]["data"] == {"reason": "timeout", "run_status": "RUNNING"}
    engine.send_event(run_id, "go")
    engine.drain()
    again = events(http.get(f"/v1/runs/{run_id}/streams/open?timeout=1", headers={"Last-Event-ID": "1"}).text)
    assert [(e["event"], e["data"]) for e in again] == [
        ("item", "second"),
        ("end", {"reason": "run ended", "run_status": "COMPLETED"}),
    ]
    quiet = events(http.get(f"/v1/runs/{run_id}/published/never?timeout=0").text)
    assert quiet == [{"event": "end", "data": {"reason": "run ended", "run_status": "COMPLETED"}}]
    assert http.get(f"/v1/runs/{run_id}/streams/open?timeout=3601").status_code == 400


def test_a_store_that_fails_mid_stream_is_read_again(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(streamer, 3)
    engine.drain()
    real = engine.store.read_stream
    calls = {"n": 0}

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] in (2, 3):  # the reads after the first page fail twice
            raise ConnectionError("the database went away")
        return real(*args)

    engine.store.read_stream = flaky  # type: ignore[method-assign]
    got = events(http.get(f"/v1/runs/{run_id}/streams/items").text)
    engine.store.read_stream = real  # type: ignore[method-assign]
    assert [e.get("id") for e in got] == ["1", "2", "3", None] and got[-1]["data"]["reason"] == "closed"
    assert calls["n"] >= 4


def test_the_openapi_document_says_they_are_event_streams(http: Any) -> None:
    paths = http.get("/v1/openapi.json").json()["paths"]
    for path in ("/v1/runs/{run_id}/streams/{key}", "/v1/runs/{run_id}/published/{key}"):
        assert list(paths[path]["get"]["responses"]["200"]["content"]) == ["text/event-stream"]
