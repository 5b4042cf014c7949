"""Poison (docs/reference/contract.md §8) through HTTP: NUL and lone surrogates in every place a request carries
text, hostile values in bodies, and a store that fails mid-request. Each gets its own clear
error, and a healthy run started afterwards completes."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import dex
from dex.web import create_app
from tests.web.conftest import checkout, client

POISON = ["\x00", "\ud800"]


def healthy_run_completes(engine: dex.Engine, http: Any) -> None:
    # forced: over a bare app, the engine that runs it drains and is not a started (listed) one
    response = http.post("/v1/runs", json={"workflow": "web-checkout", "args": [3], "force": True})
    assert response.status_code == 201, response.text
    engine.drain()
    assert http.get(f"/v1/runs/{response.json()['run_id']}").json()["status"] == "COMPLETED"


@pytest.mark.parametrize("bad", POISON, ids=["nul", "surrogate"])
def test_poisoned_query_and_path_parameters_are_400s(engine: dex.Engine, http: Any, bad: str) -> None:
    encoded = "%00" if bad == "\x00" else "%ED%A0%80"
    for url in (
        f"/v1/runs?workflow=a{encoded}",
        f"/v1/runs?instance_id=a{encoded}",
        f"/v1/runs?label=k{encoded}=v",
        f"/v1/runs?label=k=v{encoded}",
        f"/v1/runs?code_version={encoded}",
        f"/v1/runs?status={encoded}",
    ):
        response = http.get(url)
        # a surrogate's UTF-8 form is not UTF-8: decoded, it is a replacement character, which
        # matches nothing (200) or is refused (400) - never a 500
        assert response.status_code in (200, 400), url
        assert "error" in response.json() or response.json()["runs"] == []
    assert http.get(f"/v1/runs/a{encoded}").status_code in (400, 404)
    assert http.post(f"/v1/runs/a{encoded}/cancel").status_code in (400, 404)
    assert http.post(f"/v1/schedules/a{encoded}/pause").status_code in (400, 404, 422)  # not a schedule name
    assert http.get(f"/runs/a{encoded}").status_code in (400, 404)
    healthy_run_completes(engine, http)


@pytest.mark.parametrize("bad", POISON, ids=["nul", "surrogate"])
def test_poisoned_json_bodies_are_refused_with_their_own_error(engine: dex.Engine, http: Any, bad: str) -> None:
    run_id = engine.start_workflow(checkout, 1)
    bodies = [
        ("/v1/runs", {"workflow": f"web-checkout{bad}", "args": [1]}),
        ("/v1/runs", {"workflow": "web-checkout", "args": [1], "labels": {f"k{bad}": "v"}}),
        ("/v1/runs", {"workflow": "web-checkout", "args": [1], "labels": {"k": f"v{bad}"}}),
        ("/v1/runs", {"workflow": "web-checkout", "args": [1], "instance_id": f"i{bad}"}),
        (f"/v1/runs/{run_id}/events", {"event_id": f"go{bad}"}),
        (f"/v1/runs/{run_id}/cancel", {"reason": f"r{bad}"}),
        (f"/v1/runs/{run_id}/terminate", {"reason": f"r{bad}"}),
    ]
    # values (arguments, payloads) are JSON in a payload: a NUL is a value like any other, a
    # lone surrogate is refused by the payload converter; never a 5xx
    values = [
        ("/v1/runs", {"workflow": "web-checkout", "args": [f"x{bad}"]}),
        (f"/v1/runs/{run_id}/events", {"event_id": "go", "payload": {"k": f"v{bad}"}}),
    ]
    import json

    for url, body in bodies + values:
        # json.dumps writes a lone surrogate as the escape \ud800, which json.loads reads back
        response = http.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        if (url, body) in values and response.status_code < 300:
            continue
        assert response.status_code in (400, 422), (url, body, response.text)
        assert set(response.json()["error"]) == {"type", "message"}
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED  # its own run went on
    healthy_run_completes(engine, http)


def test_a_body_that_is_not_utf8_is_a_400_and_one_too_big_a_413(engine: dex.Engine, http: Any) -> None:
    assert http.post("/v1/runs", content=b"\xff\xfe{", headers={"content-type": "application/json"}).status_code == 400
    big = b'{"workflow": "' + b"x" * (2 << 20) + b'"}'
    too_big = http.post("/v1/runs", content=big, headers={"content-type": "application/json"})
    assert too_big.status_code == 413  # more in test_body_limit.py
    assert too_big.json()["error"]["type"] == "PayloadTooLarge"
    form = http.post(
        "/runs/x/cancel", content=b"reason=%ff%fe", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 400
    healthy_run_completes(engine, http)


class FailingStore:
    """A store whose reads fail while ``failing`` is set (with ``error``)."""

    READS = frozenset(
        {
            "get_run",
            "list_runs",
            "load_history",
            "load_history_after",
            "list_queues",
            "list_schedules",
            "get_schedule",
            "list_engines",
        }
    )

    def __init__(self, store: Any) -> None:
        self._store = store
        self.failing = False
        self.error: Exception = ConnectionError("the database went away")

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name not in self.READS:
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failing:
                raise self.error
            return target(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    "error, status",
    [
        (ConnectionError("the database went away"), 503),
        (psycopg.OperationalError("server closed the connection unexpectedly"), 503),
        (RuntimeError("something nobody expected"), 500),
        (type("OddBaseException", (BaseException,), {})("not an Exception"), 500),
    ],
    ids=["connection", "psycopg", "unexpected", "base-exception"],
)
def test_a_store_failing_mid_request_is_a_json_5xx_and_the_next_run_completes(
    make_engine: Any, error: Exception, status: int
) -> None:
    from tests.web.conftest import ACTIVITIES, WORKFLOWS

    inner = make_engine(WORKFLOWS, ACTIVITIES)
    store = FailingStore(inner.store)
    engine = dex.Engine(store, workflows=WORKFLOWS, activities=ACTIVITIES)  # type: ignore[arg-type]
    run_id = engine.start_workflow(checkout, 1)
    with client(create_app(engine)) as http:
        store.failing, store.error = True, error
        history = f"/v1/runs/{run_id}/history"
        for url in (
            "/v1/runs",
            f"/v1/runs/{run_id}",
            history,
            f"{history}?limit=5&after=1",
            "/v1/queues",
            "/v1/engines",
        ):
            response = http.get(url)
            assert response.status_code == status, url
            assert set(response.json()["error"]) == {"type", "message"}
        for page in ("/", "/runs", f"/runs/{run_id}", f"/runs/{run_id}?from=2", "/queues", "/workers"):
            assert http.get(page).status_code == status, page
        store.failing = False
        healthy_run_completes(engine, http)


def test_an_unprintable_exception_from_the_store_is_still_answered(make_engine: Any) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    from tests.web.conftest import ACTIVITIES, WORKFLOWS

    inner = make_engine(WORKFLOWS, ACTIVITIES)
    store = FailingStore(inner.store)
    engine = dex.Engine(store, workflows=WORKFLOWS, activities=ACTIVITIES)  # type: ignore[arg-type]
    with client(create_app(engine)) as http:
        store.failing, store.error = True, Unprintable()
        run_id = engine.start_workflow(checkout, 1)
        for url in ("/v1/runs", f"/v1/runs/{run_id}/history?limit=2"):
            response = http.get(url)
            assert response.status_code == 500 and "Unprintable" in response.json()["error"]["message"], url
        store.failing = False
        healthy_run_completes(engine, http)


def test_json_that_is_not_strict_json_or_nested_too_deep_is_refused(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(checkout, 1)
    for body in (
        b'{"workflow": "web-checkout", "args": [NaN]}',
        b'{"workflow": "web-checkout", "args": [Infinity]}',
        b'{"workflow": "web-checkout", "args": [1e999]}',
        b'{"workflow": "web-checkout", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ):
        response = http.post("/v1/runs", content=body, headers={"content-type": "application/json"})
        assert response.status_code in (400, 422), body[:60]
    deep = b'{"event_id": "go", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = http.post(f"/v1/runs/{run_id}/events", content=deep, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    healthy_run_completes(engine, http)


class UnprintableStoreError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    "error, status",
    [
        (ConnectionError("the database went away"), 503),
        (UnprintableStoreError(), 500),
        (type("OddBaseException", (BaseException,), {})("not an Exception"), 500),
    ],
    ids=["connection", "unprintable", "base-exception"],
)
def test_a_start_by_name_without_code_over_a_failing_store_makes_nothing(
    make_engine: Any, error: BaseException, status: int
) -> None:
    from tests.web.conftest import ACTIVITIES, WORKFLOWS

    worker = make_engine(WORKFLOWS, ACTIVITIES)
    store = FailingStore(worker.store)
    store.READS = FailingStore.READS | {"create_run", "create_run_then_claim"}  # the write fails too
    with client(create_app(store)) as bare:  # no code: the start reads the newest run's queue, then writes
        store.failing, store.error = True, error
        forced = {"workflow": "web-checkout", "queue": "default", "force": True}
        for body in ({"workflow": "web-checkout", "args": [3]}, forced):
            response = bare.post("/v1/runs", json=body)  # the registry's read fails; forced, with a queue, the write
            assert response.status_code == status and set(response.json()["error"]) == {"type", "message"}
        store.failing = False
        poisons = ["web\x00checkout", "web\ud800checkout"]
        for field in ("workflow", "instance_id", "concurrency_key", "queue"):
            for poisoned in poisons:
                fields = {"workflow": "web-checkout", "args": [3], field: poisoned}
                body = json.dumps(fields)  # sent JSON-escaped
                refused = bare.post("/v1/runs", content=body, headers={"content-type": "application/json"})
                assert refused.status_code == 400, (field, refused.text)  # at the door: nothing read or written
                assert refused.json()["error"]["type"] == "BadRequest" and field in refused.json()["error"]["message"]
        for poisoned in poisons:
            body = json.dumps({"workflow": "web-checkout", "args": [3], "labels": {"k": poisoned}})
            refused = bare.post("/v1/runs", content=body, headers={"content-type": "application/json"})
            assert refused.status_code == 400 and refused.json()["error"]["type"] == "BadRequest"
        assert worker.list_runs() == []  # nothing was made
        started = bare.post("/v1/runs", json={"workflow": "web-checkout", "args": [3], "force": True})
        assert started.status_code == 201  # forced: the worker drains, it is not a started (listed) engine
    worker.drain()
    assert worker.wait(started.json()["run_id"], timeout=1) == {"receipt": "charged 3", "amount": 3}
