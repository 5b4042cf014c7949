"""The JSON API through HTTP, on both adapters: every endpoint, its answers and its errors."""

from __future__ import annotations

from typing import Any

import dex
from dex.web import create_app
from tests.web.conftest import checkout, client, failing, waiting


def error_of(response: Any) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def test_runs_are_listed_newest_first_and_paged_by_cursor_across_runs_created_at_one_instant(
    engine: dex.Engine, http: Any
) -> None:
    started = [engine.start_workflow(checkout, n) for n in range(7)]  # one virtual instant for all
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = http.get("/v1/runs", params=params).json()
        seen += [run["run_id"] for run in body["runs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(started))


def test_runs_list_filters_as_list_runs_does(engine: dex.Engine, http: Any) -> None:
    blue = engine.start_workflow(checkout, 1, labels={"colour": "blue"})
    engine.start_workflow(checkout, 2, labels={"colour": "red"})
    other = engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    by_label = http.get("/v1/runs", params={"label": "colour=blue"}).json()["runs"]
    assert [r["run_id"] for r in by_label] == [blue]
    by_name = http.get("/v1/runs", params={"workflow": "web-waiting"}).json()["runs"]
    assert [r["run_id"] for r in by_name] == [other]
    done = http.get("/v1/runs", params=[("status", "COMPLETED"), ("status", "failed")]).json()["runs"]
    assert {r["status"] for r in done} == {"COMPLETED"} and len(done) == 2
    assert http.get("/v1/runs", params={"created_after": "2999-01-01T00:00:00Z"}).json()["runs"] == []


def test_get_and_history_show_decoded_payloads(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(checkout, 42)
    engine.drain()
    run = http.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "COMPLETED"
    assert run["result"] == {"receipt": "charged 42", "amount": 42}
    events = http.get(f"/v1/runs/{run_id}/history").json()["events"]
    assert events[0]["kind"] == "RunCreated" and events[0]["event"]["input"] == [42]
    completed = [e for e in events if e["kind"] == "ActivityTaskCompleted"]
    assert completed[0]["event"]["result"] == "charged 42"
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))


def test_start_by_name_with_json_arguments_runs_the_workflow(engine: dex.Engine, http: Any) -> None:
    response = http.post(
        "/v1/runs", json={"workflow": "web-checkout", "args": [5], "labels": {"via": "api"}, "priority": 7}
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    engine.drain()
    info = engine.get_run(run_id)
    assert info.result == {"receipt": "charged 5", "amount": 5}
    assert info.labels == {"via": "api"} and info.priority == 7


def test_start_errors(engine: dex.Engine, http: Any) -> None:
    # what the OpenAPI document rules out is a 400 naming the field: the document of an app over
    # an engine with code lists its workflows and the arguments each takes
    assert http.post("/v1/runs", json={"workflow": "nope"}).status_code == 400
    assert "web-checkout" in error_of(http.post("/v1/runs", json={"workflow": "nope"}))["message"]
    assert http.post("/v1/runs", json={"args": []}).status_code == 400
    assert http.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
    assert http.post("/v1/runs", json=[1, 2]).status_code == 400
    assert http.post("/v1/runs", json={"workflow": "web-checkout", "args": "5"}).status_code == 400
    assert http.post("/v1/runs", json={"workflow": "web-checkout", "args": [1, 2, 3]}).status_code == 400
    assert http.post("/v1/runs", json={"workflow": "web-checkout", "args": [1], "priority": 1000}).status_code == 400
    assert http.post("/v1/runs", json={"workflow": "web-checkout", "args": [1], "priority": 7.0}).status_code == 201


def test_start_over_a_bare_adapter_makes_the_run_for_the_engines_with_its_code(engine: dex.Engine) -> None:
    # dex web serves a database without workflow code: the run is made by name (docs/reference/contract.md §12) on
    # the queue of the newest run of that name, and the engine that has the code runs it
    earlier = engine.start_workflow(checkout, 1, queue="payments")
    engine.drain()
    with client(create_app(engine.store)) as bare:
        # the engine is not started (this test drains it): no live engine registers the workflow,
        # so the start is forced (the refusal: tests/web/test_workers.py)
        body = {"workflow": "web-checkout", "args": [5], "labels": {"via": "web"}, "force": True}
        response = bare.post("/v1/runs", json=body)
        assert response.status_code == 201
        run_id = response.json()["run_id"]
        default = bare.post("/v1/runs", json={"workflow": "never-ran", "args": [], "queue": None, "force": True})
        assert default.status_code == 201
        # what start_workflow refuses at the call is refused here too, and nothing is made
        for bad in (
            {"workflow": "has space", "args": []},
            {"workflow": "web-checkout", "args": [1], "instance_id": "x\x00y"},
            {"workflow": "web-checkout", "args": [1], "priority": 101},
            {"workflow": "web-checkout", "args": [1], "queue": "Bad Queue"},
        ):
            refused = bare.post("/v1/runs", json=bad)
            assert refused.status_code == 400, (bad, refused.text)
            assert error_of(refused)["type"] == "BadRequest"
    info = engine.get_run(run_id)
    assert info.workflow_name == "web-checkout" and info.labels == {"via": "web"}
    assert engine.store.get_run(run_id).queue == engine.store.get_run(earlier).queue == "payments"
    assert engine.store.get_run(default.json()["run_id"]).queue == "default"
    assert len(engine.list_runs()) == 3
    engine.drain()
    assert engine.wait(run_id, timeout=1) == {"receipt": "charged 5", "amount": 5}


def test_cancel_suspend_resume_and_events(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    assert http.post(f"/v1/runs/{run_id}/suspend").status_code == 202
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.SUSPENDED
    assert http.post(f"/v1/runs/{run_id}/suspend").status_code == 409
    assert http.post(f"/v1/runs/{run_id}/resume").status_code == 202
    engine.drain(advance_time=False)
    assert http.post(f"/v1/runs/{run_id}/events", json={"event_id": "go", "payload": {"n": [1, 2]}}).status_code == 202
    engine.drain()
    assert engine.wait(run_id, timeout=5) == {"n": [1, 2]}
    other = engine.start_workflow(waiting)
    assert http.post(f"/v1/runs/{other}/cancel", json={"reason": "no longer needed"}).status_code == 202
    engine.drain()
    assert engine.get_run(other).status is dex.RunStatus.CANCELLED
    assert http.post(f"/v1/runs/{other}/cancel").status_code == 409  # it has ended
    assert http.post(f"/v1/runs/{other}/events", json={"event_id": "go"}).status_code == 409
    assert http.post(f"/v1/runs/{run_id}/events", json={}).status_code == 400


def test_unknown_runs_and_routes_are_404s(http: Any) -> None:
    for response in (
        http.get("/v1/runs/no-such-run"),
        http.get("/v1/runs/no-such-run/history"),
        http.post("/v1/runs/no-such-run/cancel"),
        http.post("/v1/runs/no-such-run/events", json={"event_id": "go"}),
        http.get("/v1/nothing-here"),
        http.get("/v1/schedules/none"),
        http.post("/v1/queues/workflow/none/pause"),
    ):
        assert response.status_code == 404, response.request.url
        error_of(response)


def test_bad_query_parameters_are_400s(http: Any) -> None:
    for params in (
        {"limit": "0"},
        {"limit": "many"},
        {"status": "SLEEPING"},
        {"created_after": "yesterday"},
        {"created_after": "2026-01-01T00:00:00"},  # no timezone
        {"label": "no-equals-sign"},
        {"cursor": "garbage!"},
    ):
        response = http.get("/v1/runs", params=params)
        assert response.status_code == 400, params
        assert error_of(response)["type"] == "BadRequest"


def test_queues(engine: dex.Engine, http: Any) -> None:
    queues = http.get("/v1/queues").json()["queues"]
    assert {"name": "default", "kind": "workflow"}.items() <= queues[0].items() or any(
        q["name"] == "default" and q["kind"] == "workflow" for q in queues
    )
    assert http.post("/v1/queues/workflow/default/pause").json()["status"] == "PAUSED"
    run_id = engine.start_workflow(checkout, 1)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED  # the paused queue holds it
    assert http.post("/v1/queues/workflow/default/resume").json()["status"] == "ACTIVE"
    assert http.post("/v1/queues/workflow/default/capacity", json={"capacity": 3}).json()["capacity"] == 3
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    assert http.post("/v1/queues/workflow/default/capacity", json={"capacity": 0}).status_code == 400  # out of range
    assert http.post("/v1/queues/workflow/default/capacity", json={}).status_code == 400
    sideways = http.post("/v1/queues/sideways/default/pause")  # no such kind: the document says which there are
    assert sideways.status_code == 400 and "workflow, activity" in sideways.json()["error"]["message"]


def test_schedules(make_engine: Any) -> None:
    nightly = dex.Schedule("web-nightly", checkout, cron="0 3 * * *", args=(9,))
    engine = make_engine(
        [checkout], [*__import__("tests.web.conftest", fromlist=["ACTIVITIES"]).ACTIVITIES], schedules=[nightly]
    )
    engine.drain(advance_time=False)
    with client(create_app(engine)) as http:
        listed = http.get("/v1/schedules").json()["schedules"]
        assert [s["name"] for s in listed] == ["web-nightly"]
        assert http.get("/v1/schedules/web-nightly").json()["cron"] == "0 3 * * *"
        paused = http.post("/v1/schedules/web-nightly/pause", json={"note": "maintenance"}).json()
        assert paused["paused"] is True and paused["note"] == "maintenance"
        assert http.post("/v1/schedules/web-nightly/resume").json()["paused"] is False
        triggered = http.post("/v1/schedules/web-nightly/trigger")
        assert triggered.status_code == 201
        engine.drain(advance_time=False)
        run = http.get(f"/v1/runs/{triggered.json()['run_id']}").json()
        assert run["labels"]["dex.schedule"] == "web-nightly" and run["status"] == "COMPLETED"
        assert http.post("/v1/schedules/nope/trigger").status_code == 404


def test_a_failed_run_shows_its_failure(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(failing)
    engine.drain()
    run = http.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "FAILED"
    assert "boom 7" in run["failure"]["message"] or "boom 7" in str(run["failure"])
