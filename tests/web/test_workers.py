"""The Workers page and ``GET /v1/engines`` (docs/reference/contract.md §15): the live engines."""

from __future__ import annotations

import html
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock
from dex.web import create_app
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, client


def test_the_workers_page_lists_each_live_engine(make_engine: Callable[..., dex.Engine], http: Any) -> None:
    worker = make_engine(WORKFLOWS, ACTIVITIES, node_id="web-node-1", code_version="build-42")
    worker.start()
    page = http.get("/workers")
    assert page.status_code == 200
    text = page.text
    assert 'href="/workers" class="here">Workers</a>' in text  # the nav link, marked as the page shown
    (info,) = worker.list_engines()
    row = text.split('<table id="workers">')[1]
    for shown in (
        "web-node-1",
        socket.gethostname(),
        f"<td>{os.getpid()}</td>",
        "build-42",
        "<td>default</td>",
        "web-checkout, web-failing, web-waiting",
        "web-charge, web-explode",
        info.last_seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
    ):
        assert shown in row, shown
    worker.stop(timeout=5)
    assert "No live engines" in http.get("/workers").text
    assert "web-node-1" not in http.get("/workers").text


def test_the_api_lists_the_live_engines(make_engine: Callable[..., dex.Engine], http: Any) -> None:
    assert http.get("/v1/engines").json() == {"engines": []}
    worker = make_engine([checkout], node_id="web-node-2")
    worker.start()
    (engine,) = http.get("/v1/engines").json()["engines"]
    assert engine["node_id"] == "web-node-2"
    assert (engine["host"], engine["pid"], engine["code_version"]) == (socket.gethostname(), os.getpid(), None)
    assert (engine["workflows"], engine["activities"], engine["queues"]) == (["web-checkout"], [], ["default"])
    assert engine["started_at"].endswith("Z") and engine["last_seen"] >= engine["started_at"]


def test_a_crashed_engine_drops_out_of_the_page(
    make_engine: Callable[..., dex.Engine], clock: VirtualClock, http: Any
) -> None:
    worker = make_engine([checkout], node_id="web-node-3")
    worker.start()
    now = clock.now()
    gone = dex.EngineInfo(
        node_id="web-crashed",
        host="elsewhere",
        pid=7,
        code_version=None,
        workflows=(),
        activities=(),
        queues=(),
        started_at=now,
        last_seen=now,
    )
    worker.store.heartbeat_engine(gone, now, now + timedelta(seconds=15))
    assert "web-crashed" in http.get("/workers").text
    clock.advance(16)
    assert "web-crashed" not in http.get("/workers").text
    assert "web-crashed" not in [e["node_id"] for e in http.get("/v1/engines").json()["engines"]]


def test_names_are_shown_as_text_never_markup(make_engine: Callable[..., dex.Engine]) -> None:
    node_id = '<script>alert("x")</script>&amp;'
    worker = make_engine([checkout], node_id=node_id)
    worker.start()
    with client(create_app(worker)) as http:
        text = http.get("/workers").text
    row = text.split('<table id="workers">')[1]
    assert "<script>" not in row
    assert node_id in html.unescape(row)  # the text itself, escaped


def test_a_start_by_name_no_live_engine_registers_is_refused_unless_forced(
    make_engine: Callable[..., dex.Engine],
) -> None:
    worker = make_engine(WORKFLOWS, ACTIVITIES, node_id="web-node-4")
    with client(create_app(worker.store)) as bare:  # dex web over the database: no code of its own
        refused = bare.post("/v1/runs", json={"workflow": "web-checkout", "args": [2]})
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["type"] == "NotRegisteredError" and "'web-checkout'" in error["message"]
        assert bare.post("/v1/runs", json={"workflow": "web-checkout", "args": [2], "force": "yes"}).status_code == 400
        assert worker.list_runs() == []  # nothing was made
        worker.start()
        started = bare.post("/v1/runs", json={"workflow": "web-checkout", "args": [2]})
        assert started.status_code == 201
        assert worker.wait(started.json()["run_id"], timeout=10) == {"receipt": "charged 2", "amount": 2}
        unknown = bare.post("/v1/runs", json={"workflow": "web-unknown", "args": []})
        assert unknown.status_code == 422 and "'web-unknown'" in unknown.json()["error"]["message"]
        worker.stop(timeout=5)
        assert bare.post("/v1/runs", json={"workflow": "web-checkout", "args": [3]}).status_code == 422
        forced = bare.post("/v1/runs", json={"workflow": "web-unknown", "args": [], "force": True})
        assert forced.status_code == 201
        assert worker.get_run(forced.json()["run_id"]).status is dex.RunStatus.CREATED
    assert len(worker.list_runs()) == 2


def test_start_by_name_refuses_a_name_no_live_engine_registers(make_engine: Callable[..., dex.Engine]) -> None:
    worker = make_engine(WORKFLOWS, ACTIVITIES)
    bare = dex.Engine(worker.store)
    with pytest.raises(dex.NotRegisteredError, match="'web-checkout'"):
        bare.start_by_name("web-checkout", [1])
    with pytest.raises(TypeError, match="force"):
        bare.start_by_name("web-checkout", [1], force=1)  # type: ignore[arg-type]
    assert worker.list_runs() == []
    run_id = bare.start_by_name("web-checkout", [1], force=True)
    worker.drain()
    assert worker.wait(run_id, timeout=1) == {"receipt": "charged 1", "amount": 1}
