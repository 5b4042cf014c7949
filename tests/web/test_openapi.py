"""The OpenAPI document covers every route the app serves and says what the server does (its
rules are the ones each request is checked against, its statuses, headers and security the ones
it answers with; tests/web/test_schemathesis.py fuzzes the rest), and the core package stays free
of the web dependencies."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import attrs
import pytest
from starlette.routing import Route

import dex
from dex.app.ports.store import QueueInfo
from dex.app.schedules.spec import ScheduleInfo
from dex.web import Operation, create_app
from dex.web.openapi import SCHEMAS
from dex.web.operations import json as json_response
from dex.web.validation import KEYWORDS
from tests.web.conftest import checkout, client


def served_api_routes(app: Any) -> set[tuple[str, str]]:
    found = set()
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/v1"):
            for method in route.methods or ():
                if method != "HEAD":
                    found.add((route.path, method.lower()))
    return found


def test_every_api_route_is_in_the_openapi_document(engine: dex.Engine, http: Any) -> None:
    document = http.get("/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    served = served_api_routes(http.app)
    assert served and served <= documented
    assert served >= {("/v1/runs", "get"), ("/v1/runs", "post"), ("/v1/runs/{run_id}/cancel", "post")}
    for path, item in document["paths"].items():
        for operation in item.values():
            names = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert names == set(re.findall(r"{(\w+)", path)), path


def test_extra_operations_are_served_under_the_same_guard_and_documented(engine: dex.Engine) -> None:
    async def ping(request: Any, web: Any) -> Any:
        return json_response({"pong": True})

    extra = Operation(method="POST", path="/v1/activity-tasks/ping", handler=ping, summary="ping", tag="remote")
    app = create_app(engine, token="tok", extra_operations=[extra])
    with client(app) as http:
        assert http.post("/v1/activity-tasks/ping").status_code == 401
        assert http.post("/v1/activity-tasks/ping", headers={"authorization": "Bearer tok"}).json() == {"pong": True}
        document = http.get("/v1/openapi.json", headers={"authorization": "Bearer tok"}).json()
    assert "post" in document["paths"]["/v1/activity-tasks/ping"]


def test_importing_dex_does_not_import_the_web_dependencies() -> None:
    code = "import sys, dex, dex.cli; bad = [m for m in ('starlette', 'jinja2', 'uvicorn', 'dex.web') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/queues", "/v1/schedules"])
def test_json_answers_are_json(http: Any, path: str) -> None:
    response = http.get(path)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"


def schemas_in(schema: Any) -> Any:
    """``schema`` and every schema inside it."""
    yield schema
    for key in ("properties",):
        for inner in schema.get(key, {}).values():
            yield from schemas_in(inner)
    for key in ("items", "additionalProperties", "propertyNames"):
        if isinstance(schema.get(key), dict):
            yield from schemas_in(schema[key])
    for inner in schema.get("anyOf", ()):
        yield from schemas_in(inner)


def test_every_request_schema_uses_only_rules_the_server_checks(engine: dex.Engine) -> None:
    # a keyword the door (dex.web.validation) does not know would be shown and not enforced
    app = create_app(engine, token="tok")
    for operation in app.state.operations:
        declared = [param.schema for param in operation.params]
        declared += [operation.body] if operation.body is not None else []
        for schema in declared:
            for inner in schemas_in(schema):
                assert set(inner) <= KEYWORDS, (operation.path, set(inner) - KEYWORDS)


def test_what_the_document_rules_out_is_a_400_naming_the_field_and_nothing_is_made(
    engine: dex.Engine, http: Any
) -> None:
    refused = {
        "/v1/runs": [
            ({"workflow": "web\x00checkout", "args": [1]}, "workflow"),
            ({"workflow": "web-checkout", "args": [1], "instance_id": "a\x00b"}, "instance_id"),
            ({"workflow": "web-checkout", "args": [1], "instance_id": "a\ud800b"}, "instance_id"),
            ({"workflow": "web-checkout", "args": [1], "labels": {"k": "v\x00"}}, "labels"),
            ({"workflow": "web-checkout", "args": [1], "labels": {"k\x00": "v"}}, "labels"),
            ({"workflow": "web-checkout", "args": [1], "priority": 101}, "priority"),
            ({"workflow": "web-checkout", "args": [1], "priority": 7.5}, "priority"),
            ({"workflow": "web-checkout", "args": [1], "queue": "Not A Queue"}, "queue"),
            ({"workflow": "web-checkout", "args": [1, 2]}, "args"),  # it takes one argument
            ({"workflow": "no-such-workflow", "args": []}, "workflow"),
            ({"args": [1]}, "workflow"),
        ],
        "/v1/queues/workflow/default/capacity": [({}, "capacity"), ({"capacity": 2**31}, "capacity")],
    }
    for path, bodies in refused.items():
        for body, field in bodies:
            answer = http.post(path, content=json_dumps(body), headers={"content-type": "application/json"})
            error = answer.json()["error"]
            assert (answer.status_code, error["type"]) == (400, "BadRequest"), (body, answer.text)
            assert field in error["message"], (field, error["message"])
    for url, field in (
        ("/v1/runs?limit=0", "limit"),
        ("/v1/runs?status=LOST", "status"),
        ("/v1/runs?created_after=yesterday", "created_after"),
        ("/v1/runs/a%00b", "run_id"),
        ("/v1/runs/x/history?after=-1", "after"),
        ("/v1/schedules/has%20space", "name"),
    ):
        answer = http.get(url)
        assert answer.status_code == 400 and field in answer.json()["error"]["message"], (url, answer.text)
    assert engine.list_runs() == []  # nothing was made
    # RFC 3339, as the document's date-time says: lower-case t and z, and a "+" a query turned to a space
    for moment in ("2020-01-01t00:00:00z", "2020-01-01T00:00:00.5+01:00", "2020-01-01T00:00:00 01:00"):
        assert http.get("/v1/runs", params={"created_after": moment}).status_code == 200, moment
    # and what the document allows is taken: 7.0 is an integer, as JSON Schema counts it
    started = http.post("/v1/runs", json={"workflow": "web-checkout", "args": [5], "priority": 7.0})
    assert started.status_code == 201, started.text
    engine.drain()
    assert engine.wait(started.json()["run_id"], timeout=5) == {"receipt": "charged 5", "amount": 5}
    assert engine.get_run(started.json()["run_id"]).priority == 7


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value)  # escapes NUL and lone surrogates, as any JSON client sends them


def test_every_405_says_which_methods_the_path_serves(engine: dex.Engine, http: Any) -> None:
    document = http.get("/v1/openapi.json").json()
    for path, item in document["paths"].items():
        url = re.sub(r"{(\w+)}", "x", path)
        served = {method.upper() for method in item} | ({"HEAD"} if "get" in item else set())
        for method in ("PUT", "DELETE", "PATCH", "TRACE"):
            answer = http.request(method, url)
            assert answer.status_code == 405, (method, path)
            assert set(answer.headers["allow"].split(", ")) == served, (method, path)
            assert "405" in next(iter(item.values()))["responses"]
    page = http.request("DELETE", "/runs")  # a page too
    assert page.status_code == 405 and "GET" in page.headers["allow"]


def test_the_document_states_the_security_the_app_has(engine: dex.Engine) -> None:
    with client(create_app(engine, token="tok")) as http:
        guarded = http.get("/v1/openapi.json", headers={"authorization": "Bearer tok"}).json()
    with client(create_app(engine)) as http:
        open_ = http.get("/v1/openapi.json").json()
    assert guarded["security"] == [{"bearer": []}]
    assert guarded["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert open_["security"] == [] and "securitySchemes" not in open_["components"]
    assert "loopback" in open_["info"]["description"]
    for document, token in ((guarded, True), (open_, False)):
        for path, item in document["paths"].items():
            for method, operation in item.items():
                answers = operation["responses"]
                assert ("401" in answers) is token, (path, method)
                assert {"403", "405"} <= set(answers), (path, method)
                if method == "post":
                    assert "413" in answers, path
                for status, answer in answers.items():
                    if status.startswith(("4", "5")):
                        kind = answer["content"]["application/json"]["schema"]["properties"]["error"]
                        assert "enum" in kind["properties"]["type"] or "pattern" in kind["properties"]["type"]


def test_the_schemas_of_answers_name_every_field_the_server_sends(engine: dex.Engine, http: Any) -> None:
    assert {field.name for field in attrs.fields(ScheduleInfo)} <= set(SCHEMAS["Schedule"]["properties"])
    assert {field.name for field in attrs.fields(QueueInfo)} <= set(SCHEMAS["Queue"]["properties"])
    run_id = engine.start_workflow(checkout, 1)
    engine.drain()
    assert set(http.get(f"/v1/runs/{run_id}").json()) <= set(SCHEMAS["Run"]["properties"])
    (step,) = http.get(f"/v1/runs/{run_id}/activity-steps").json()["activity_steps"]
    assert set(step) == set(SCHEMAS["ActivityStep"]["properties"])
