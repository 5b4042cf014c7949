"""docs/reference/contract.md §12's security rules: the token (bearer or the sign-in cookie), the same-origin check
on state-changing requests, the loopback-only Host without a token, and the token kept out of
pages, cookies and logs."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

import dex
from dex.web import create_app
from dex.web.security import COOKIE
from tests.web.conftest import BASE, client, waiting

TOKEN = "s3cret-Token-value"


@pytest.fixture
def guarded(engine: dex.Engine) -> Any:
    with client(create_app(engine, token=TOKEN)) as c:
        yield c


def signed_in(http: Any) -> None:
    response = http.post(
        "/signin", data={"token": TOKEN, "next": "/runs"}, headers={"origin": BASE}, follow_redirects=False
    )
    assert response.status_code == 303 and response.headers["location"] == "/runs"


def test_without_the_token_the_api_is_401_and_the_pages_send_to_the_sign_in_form(guarded: Any) -> None:
    response = guarded.get("/v1/runs")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "Unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert guarded.get("/v1/runs", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert guarded.get("/v1/openapi.json").status_code == 401
    page = guarded.get("/runs?status=RUNNING", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/signin?next=%2Fruns%3Fstatus")
    assert guarded.get("/signin").status_code == 200
    assert guarded.get("/static/dex.css").status_code == 200


def test_a_bearer_token_opens_every_route(guarded: Any, engine: dex.Engine) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert guarded.get("/v1/runs", headers=auth).status_code == 200
    assert guarded.get("/", headers=auth).status_code == 200
    run_id = engine.start_workflow(waiting)
    assert guarded.post(f"/v1/runs/{run_id}/cancel", headers=auth).status_code == 202


def test_the_sign_in_form_sets_an_http_only_cookie_that_does_not_hold_the_token(guarded: Any) -> None:
    failed = guarded.post("/signin", data={"token": "wrong", "next": "/"}, headers={"origin": BASE})
    assert failed.status_code == 401 and COOKIE not in failed.cookies
    response = guarded.post(
        "/signin", data={"token": TOKEN, "next": "/"}, headers={"origin": BASE}, follow_redirects=False
    )
    header = response.headers["set-cookie"]
    assert "httponly" in header.lower() and "samesite=strict" in header.lower()
    assert TOKEN not in header
    assert guarded.get("/runs").status_code == 200  # the client keeps the cookie
    assert guarded.get("/v1/runs").status_code == 200
    guarded.post("/signout", headers={"origin": BASE})
    assert guarded.get("/v1/runs").status_code == 401


def test_the_sign_in_form_never_redirects_off_site(guarded: Any) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        response = guarded.post(
            "/signin", data={"token": TOKEN, "next": target}, headers={"origin": BASE}, follow_redirects=False
        )
        assert response.headers["location"] == "/"


def test_state_changing_requests_from_another_origin_are_refused(guarded: Any, engine: dex.Engine) -> None:
    signed_in(guarded)
    run_id = engine.start_workflow(waiting)
    for headers in (
        {"origin": "https://evil.example"},
        {"origin": "null"},
        {"referer": "https://evil.example/page"},
        {"sec-fetch-site": "cross-site"},
    ):
        page = guarded.post(f"/runs/{run_id}/cancel", headers=headers, follow_redirects=False)
        assert page.status_code == 403, headers
        api = guarded.post(f"/v1/runs/{run_id}/cancel", headers=headers)
        assert api.status_code == 403 and api.json()["error"]["type"] == "Forbidden"
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is not dex.RunStatus.CANCELLED
    same = guarded.post(f"/runs/{run_id}/cancel", headers={"origin": BASE}, follow_redirects=False)
    assert same.status_code == 303
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED


def test_without_a_token_only_a_loopback_host_is_served(engine: dex.Engine) -> None:
    with client(create_app(engine)) as http:
        assert http.get("/v1/runs").status_code == 200
        assert http.get("/v1/runs", headers={"host": "localhost:8765"}).status_code == 200
        rebound = http.get("/v1/runs", headers={"host": "attacker.example"})
        assert rebound.status_code == 403 and rebound.json()["error"]["type"] == "Forbidden"
        assert http.get("/", headers={"host": "attacker.example"}).status_code == 403
    with TestClient(create_app(engine)) as in_process:  # Starlette's own Host, "testserver"
        assert in_process.get("/v1/runs").status_code == 200
        assert in_process.get("/v1/runs", headers={"host": "testserver.attacker.example"}).status_code == 403
    with client(create_app(engine, token=TOKEN)) as http:  # with a token any Host may be used
        assert (
            http.get("/v1/runs", headers={"host": "dex.internal", "authorization": f"Bearer {TOKEN}"}).status_code
            == 200
        )


def test_the_token_never_appears_in_pages_or_logs(guarded: Any, engine: dex.Engine, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    signed_in(guarded)
    run_id = engine.start_workflow(waiting, labels={"k": "v"})
    engine.drain(advance_time=False)
    bodies = [guarded.get(path).text for path in ("/", "/runs", f"/runs/{run_id}", "/queues", "/schedules", "/signin")]
    bodies.append(guarded.get("/v1/openapi.json").text)
    bodies.append(guarded.post("/signin", data={"token": "wrong"}, headers={"origin": BASE}).text)
    for body in bodies:
        assert TOKEN not in body
    assert TOKEN not in caplog.text


def test_a_bad_token_is_refused_when_the_app_is_made() -> None:
    from dex.adapters.memory import InMemoryAdapter

    for bad in ("", " padded ", "line\nbreak"):
        with pytest.raises(ValueError, match="token"):
            create_app(InMemoryAdapter(), token=bad)


def test_pages_escape_everything_user_supplied(engine: dex.Engine, http: Any) -> None:
    hostile = "<script>alert('x')</script>"
    run_id = engine.start_workflow(waiting, labels={hostile: hostile}, instance_id=f"i-{hostile}")
    engine.drain(advance_time=False)
    engine.send_event(run_id, "go", {"html": hostile})
    engine.drain()
    for path in ("/runs", f"/runs/{run_id}", "/runs/table", "/"):
        body = http.get(path).text
        assert "<script>alert" not in body, path
    page = http.get(f"/runs/{run_id}").text
    assert "&lt;script&gt;alert(" in page
    assert re.search(r"<script(?! src=\"/static/dex.js\")", page) is None


def test_every_response_forbids_framing_and_foreign_scripts(http: Any) -> None:
    for response in (http.get("/"), http.get("/v1/runs"), http.get("/v1/runs/nope"), http.get("/static/dex.js")):
        policy = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
