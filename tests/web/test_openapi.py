"""The OpenAPI document covers every route the app serves, and the core package stays free of
the web dependencies."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
from starlette.routing import Route

import dex
from dex.web import Operation, create_app
from dex.web.operations import json as json_response
from tests.web.conftest import client


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
