"""``POST /v1/runs/{run_id}/updates`` and ``.../queries`` through HTTP, on both adapters: the
answers, each error's status, and poison (docs/reference/contract.md §12, §14)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.web import create_app
from tests.web.conftest import client


@dex.workflow(name="web-cart")
async def web_cart(ctx: dex.WorkflowContext) -> list[str]:
    items: list[str] = []

    @ctx.on_update("add")
    def add(item: str) -> dict[str, Any]:
        items.append(item)
        return {"count": len(items)}

    @add.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_update("fail")
    def fail() -> None:
        raise RuntimeError("out of stock")

    @ctx.on_update("nap")
    async def nap() -> str:
        await ctx.sleep(timedelta(hours=1))
        return "rested"

    @ctx.on_query("items")
    def current(prefix: str = "") -> list[str]:
        return [prefix + item for item in items]

    await ctx.wait_condition(lambda: "done" in items)
    return items


@pytest.fixture
def cart_engine(make_engine: Callable[..., dex.Engine]) -> dex.Engine:
    return make_engine([web_cart])


@pytest.fixture
def http(cart_engine: dex.Engine) -> Iterator[Any]:
    with client(create_app(cart_engine)) as c:
        yield c


def error_of(response: Any) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_an_update_answers_with_the_handlers_result(cart_engine: dex.Engine, http: Any) -> None:
    run_id = cart_engine.start_workflow(web_cart)
    answer = http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["lamp"], "update_id": "u1"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"run_id": run_id, "update_id": "u1", "answered": True, "result": {"count": 1}}
    again = http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["other"], "update_id": "u1"})
    assert again.json()["result"] == {"count": 1}  # the recorded answer: the handler ran once
    generated = http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["desk"]}).json()
    assert generated["result"] == {"count": 2} and generated["update_id"]
    queried = http.post(f"/v1/runs/{run_id}/queries", json={"name": "items", "args": ["#"]})
    assert queried.status_code == 200, queried.text
    assert queried.json() == {"run_id": run_id, "result": ["#lamp", "#desk"]}


def test_each_error_has_its_status(cart_engine: dex.Engine, http: Any) -> None:
    run_id = cart_engine.start_workflow(web_cart)
    cases = [
        ({"name": "add", "args": [""]}, 409, "UpdateRejectedError"),
        ({"name": "remove", "args": ["lamp"]}, 409, "UpdateRejectedError"),
        ({"name": "fail"}, 409, "UpdateFailedError"),
        ({"args": []}, 400, "BadRequest"),
        ({"name": "add", "args": "lamp"}, 400, "BadRequest"),
        ({"name": "add", "args": ["x"], "timeout": 100000}, 400, "BadRequest"),
    ]
    for body, status, kind in cases:
        answer = http.post(f"/v1/runs/{run_id}/updates", json=body)
        assert (answer.status_code, error_of(answer)["type"]) == (status, kind), (body, answer.text)
    assert http.post("/v1/runs/nope/updates", json={"name": "add", "args": ["x"]}).status_code == 404
    pending = http.post(f"/v1/runs/{run_id}/updates", json={"name": "nap", "update_id": "n1", "timeout": 0})
    assert pending.status_code == 202, pending.text  # accepted, not answered yet: no error
    assert pending.json()["answered"] is False and pending.json()["update_id"] == "n1"
    missing = http.post(f"/v1/runs/{run_id}/queries", json={"name": "missing"})
    assert (missing.status_code, error_of(missing)["type"]) == (409, "QueryError")
    assert http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["done"]}).status_code == 200
    cart_engine.drain()
    ended = http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["late"]})
    assert (ended.status_code, error_of(ended)["type"]) == (409, "InvalidStateError")
    assert http.post(f"/v1/runs/{run_id}/queries", json={"name": "items"}).json()["result"] == ["done"]


@pytest.mark.parametrize("bad", ["\x00", "\ud800"])
def test_poison_is_refused_and_a_healthy_update_follows(cart_engine: dex.Engine, http: Any, bad: str) -> None:
    run_id = cart_engine.start_workflow(web_cart)
    for path, body, field in [
        ("updates", {"name": f"add{bad}", "args": ["x"]}, "name"),
        ("updates", {"name": "add", "args": ["x"], "update_id": f"u{bad}"}, "update_id"),
        ("queries", {"name": f"items{bad}"}, "name"),
    ]:
        # json.dumps escapes a lone surrogate as \ud800, as a hostile client would send it
        sent = json.dumps(body)
        answer = http.post(f"/v1/runs/{run_id}/{path}", content=sent, headers={"content-type": "application/json"})
        assert answer.status_code in (400, 422), answer.text
        assert error_of(answer)["message"].startswith(field), answer.text
    assert http.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["ok"]}).json()["result"] == {
        "count": 1
    }


def test_an_app_without_the_workflows_code_sends_updates_but_cannot_query(
    cart_engine: dex.Engine, adapter_factory: Callable[[], Any]
) -> None:
    run_id = cart_engine.start_workflow(web_cart)
    cart_engine.drain(advance_time=False)
    with cart_engine, client(create_app(adapter_factory())) as bare:  # the started engine answers
        answer = bare.post(f"/v1/runs/{run_id}/updates", json={"name": "add", "args": ["lamp"], "timeout": 20})
        assert answer.json()["result"] == {"count": 1}, answer.text
        refused = bare.post(f"/v1/runs/{run_id}/queries", json={"name": "items"})
        assert refused.status_code == 409 and "does not register" in error_of(refused)["message"]


def test_the_openapi_document_describes_both_routes(http: Any) -> None:
    paths = http.get("/v1/openapi.json").json()["paths"]
    assert set(paths["/v1/runs/{run_id}/updates"]["post"]["responses"]) >= {"200", "202", "404", "409"}
    assert "post" in paths["/v1/runs/{run_id}/queries"]


SAME_ORIGIN = {"origin": "http://127.0.0.1:8765"}


def test_the_run_page_sends_an_update_and_asks_a_query(cart_engine: dex.Engine, http: Any) -> None:
    run_id = cart_engine.start_workflow(web_cart)
    cart_engine.drain(advance_time=False)
    page = http.get(f"/runs/{run_id}").text
    assert 'id="update-form"' in page and 'id="query-form"' in page
    sent = http.post(f"/runs/{run_id}/update", data={"name": "add", "args": '["<lamp>"]'}, headers=SAME_ORIGIN)
    assert sent.status_code == 200, sent.text  # followed to the run page, the answer in its note
    assert "update add answered: {&#34;count&#34;: 1}" in sent.text or "update add answered: {&quot;count" in sent.text
    asked = http.post(f"/runs/{run_id}/query", data={"name": "items", "args": ""}, headers=SAME_ORIGIN)
    assert "query items: [&#34;&lt;lamp&gt;&#34;]" in asked.text or "&lt;lamp&gt;" in asked.text
    assert "<lamp>" not in asked.text  # escaped
    rejected = http.post(f"/runs/{run_id}/update", data={"name": "add", "args": '[""]'}, headers=SAME_ORIGIN)
    assert rejected.status_code == 409 and "an item needs a name" in rejected.text
    not_a_list = http.post(f"/runs/{run_id}/update", data={"name": "add", "args": '{"a": 1}'}, headers=SAME_ORIGIN)
    assert not_a_list.status_code == 400 and "JSON array" in not_a_list.text
    assert cart_engine.query(run_id, "items") == ["<lamp>"]
