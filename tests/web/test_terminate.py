"""Ending runs from the dashboard and the JSON API: ``POST /v1/runs/{id}/terminate``, the run
page's Terminate button, and what the run page says of a deadline and unread events
(docs/reference/contract.md §14)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex
from tests.web.conftest import BASE, waiting

SAME_ORIGIN = {"origin": BASE}


def test_the_terminate_route_ends_the_run_at_once(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    response = http.post(f"/v1/runs/{run_id}/terminate", json={"reason": "stuck"})
    assert response.status_code == 200, response.text
    assert response.json() == {"run_id": run_id, "terminated": True}
    assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
    assert http.get(f"/v1/runs/{run_id}").json()["status"] == "TERMINATED"
    again = http.post(f"/v1/runs/{run_id}/terminate")
    assert again.status_code == 409 and again.json()["error"]["type"] == "InvalidStateError"
    assert http.post("/v1/runs/no-such-run/terminate").status_code == 404
    bad = http.post(f"/v1/runs/{engine.start_workflow(waiting)}/terminate", json={"reason": "nul\x00"})
    assert bad.status_code in (400, 422)


def test_the_run_page_has_a_terminate_button_and_shows_deadline_and_unread_events(
    engine: dex.Engine, http: Any
) -> None:
    run_id = engine.start_workflow(waiting, timeout=timedelta(hours=1))
    engine.drain(advance_time=False)
    page = http.get(f"/runs/{run_id}").text
    assert 'id="terminate"' in page and 'id="cancel"' in page
    assert 'id="deadline"' in page
    response = http.post(f"/runs/{run_id}/terminate", data={"reason": "from the page"}, headers=SAME_ORIGIN)
    assert response.status_code in (200, 303)
    assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
    assert 'id="terminate"' not in http.get(f"/runs/{run_id}").text  # an ended run has no such button

    unread = engine.start_workflow(waiting)
    engine.send_event(unread, "never-read", 1)
    engine.send_event(unread, "go", "done")
    engine.drain()  # its minute passes, "go" ends it
    assert engine.get_run(unread).unread_events == 1
    assert 'id="unread-events"' in http.get(f"/runs/{unread}").text
