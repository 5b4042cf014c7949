"""The pages, through HTTP: each renders, shows what it should, and its actions work."""

from __future__ import annotations

from typing import Any

import dex
from tests.web.conftest import BASE, checkout, failing, waiting

SAME_ORIGIN = {"origin": BASE}


def test_the_overview_shows_counts_chart_queues_and_failing_runs(engine: dex.Engine, http: Any) -> None:
    engine.start_workflow(checkout, 1)
    bad = engine.start_workflow(failing)
    engine.drain()
    page = http.get("/").text
    assert 'id="minute-chart"' in page and "<rect" in page
    assert 'id="status-counts"' in page and "completed" in page
    assert bad in page  # in the failing table
    assert "web-explode" in page or "web-failing" in page


def test_the_runs_page_filters_and_pages(engine: dex.Engine, http: Any) -> None:
    ids = [engine.start_workflow(checkout, n) for n in range(5)]
    waiting_id = engine.start_workflow(waiting)
    page = http.get("/runs", params={"workflow": "web-waiting"}).text
    assert waiting_id in page and not any(i in page for i in ids)
    first = http.get("/runs", params={"limit": 2}).text
    assert 'id="next-page"' in first
    cursor = http.get("/v1/runs", params={"limit": 2}).json()["next_cursor"]
    second = http.get("/runs", params={"limit": 2, "cursor": cursor}).text
    assert f"/runs/table?limit=2&amp;cursor={cursor}" in second  # its live refresh keeps its page
    table = http.get("/runs/table", params={"limit": 50}).text
    assert all(i in table for i in [*ids, waiting_id]) and "<html" not in table


def test_the_run_page_shows_input_result_timeline_and_history(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(checkout, 42)
    engine.drain()
    page = http.get(f"/runs/{run_id}").text
    assert 'id="timeline"' in page and "web-charge" in page
    assert "&#34;receipt&#34;: &#34;charged 42&#34;" in page or "&quot;receipt&quot;" in page
    assert "ActivityTaskCompleted" in page and "RunCompleted" in page


def test_a_failed_run_page_shows_the_stack_trace(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(failing)
    engine.drain()
    page = http.get(f"/runs/{run_id}").text
    assert 'id="failure"' in page and "boom 7" in page
    assert "raise ValueError(f&#34;boom {code}&#34;)" in page  # the stack trace, escaped


def test_actions_from_the_run_page(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    page = http.get(f"/runs/{run_id}").text
    assert 'id="pending"' not in page or "web-" in page
    response = http.post(f"/runs/{run_id}/suspend", headers=SAME_ORIGIN, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"].startswith(f"/runs/{run_id}?done=")
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.SUSPENDED
    http.post(f"/runs/{run_id}/resume", headers=SAME_ORIGIN)
    engine.drain(advance_time=True)
    http.post(f"/runs/{run_id}/event", data={"event_id": "go", "payload": '{"ok": true}'}, headers=SAME_ORIGIN)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == {"ok": True}
    bad = http.post(f"/runs/{run_id}/event", data={"event_id": "go", "payload": "{nope"}, headers=SAME_ORIGIN)
    assert bad.status_code == 400 and "payload must be JSON" in bad.text
    ended = http.post(f"/runs/{run_id}/cancel", headers=SAME_ORIGIN)
    assert ended.status_code == 409 and "has ended" in ended.text


def test_the_queues_page_pauses_resumes_and_sizes(engine: dex.Engine, http: Any) -> None:
    assert "default" in http.get("/queues").text
    http.post("/queues/workflow/default/pause", headers=SAME_ORIGIN)
    assert any(q.status == "PAUSED" for q in engine.list_queues() if q.name == "default" and q.kind == "workflow")
    http.post("/queues/workflow/default/resume", headers=SAME_ORIGIN)
    http.post("/queues/workflow/default/capacity", data={"capacity": "7"}, headers=SAME_ORIGIN)
    queue = next(q for q in engine.list_queues() if q.name == "default" and q.kind == "workflow")
    assert queue.status == "ACTIVE" and queue.capacity == 7
    assert (
        http.post("/queues/workflow/default/capacity", data={"capacity": "x"}, headers=SAME_ORIGIN).status_code == 400
    )


def test_the_schedules_page_and_its_actions(make_engine: Any) -> None:
    from dex.web import create_app
    from tests.web.conftest import ACTIVITIES, client

    engine = make_engine(
        [checkout], ACTIVITIES, schedules=[dex.Schedule("web-hourly", checkout, cron="0 * * * *", args=(1,))]
    )
    engine.drain(advance_time=False)
    with client(create_app(engine)) as http:
        assert "web-hourly" in http.get("/schedules").text
        http.post("/schedules/web-hourly/pause", data={"note": "<b>bold</b>"}, headers=SAME_ORIGIN)
        page = http.get("/schedules").text
        assert "&lt;b&gt;bold&lt;/b&gt;" in page
        http.post("/schedules/web-hourly/trigger", headers=SAME_ORIGIN)
        assert engine.get_schedule("web-hourly").last_run_id is not None


def test_unknown_pages_and_runs_are_404_pages(http: Any) -> None:
    assert http.get("/nothing").status_code == 404
    response = http.get("/runs/no-such-run")
    assert response.status_code == 404 and "no run with id" in response.text


def test_mounted_under_a_prefix_every_link_and_action_keeps_it(engine: dex.Engine) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from dex.web import create_app
    from tests.web.conftest import client

    outer = Starlette(routes=[Mount("/dex", app=create_app(engine, token="tok"))])
    run_id = engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    with client(outer) as http:
        assert http.get("/dex/v1/runs").status_code == 401  # the API, guarded under the prefix
        to_sign_in = http.get(f"/dex/runs/{run_id}", follow_redirects=False)
        assert to_sign_in.headers["location"] == f"/dex/signin?next=%2Fruns%2F{run_id}"
        signed = http.post(
            "/dex/signin", data={"token": "tok", "next": f"/runs/{run_id}"}, headers=SAME_ORIGIN, follow_redirects=False
        )
        assert signed.headers["location"] == f"/dex/runs/{run_id}"
        assert "path=/dex/" in signed.headers["set-cookie"].lower()
        page = http.get(f"/dex/runs/{run_id}").text
        assert 'href="/dex/static/dex.css"' in page and f'action="/dex/runs/{run_id}/cancel"' in page
        assert 'href="/runs' not in page and 'action="/runs' not in page
        assert http.get("/dex/static/dex.js").status_code == 200
        done = http.post(f"/dex/runs/{run_id}/cancel", headers=SAME_ORIGIN, follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"].startswith(f"/dex/runs/{run_id}?done=")
        assert http.get("/dex/v1/runs").json()["runs"][0]["run_id"] == run_id
        assert http.get("/dex/v1/nothing").json()["error"]["type"] == "NotFound"
