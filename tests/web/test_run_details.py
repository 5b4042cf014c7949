"""The run page's details on both adapters: pending activities with their attempt and next
retry, children and parent, and the fork action."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.web import create_app
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, client


@dex.activity(name="web-flaky", retry=dex.RetryPolicy(max_attempts=5, initial_delay=timedelta(hours=1)))
def flaky() -> int:
    raise ConnectionError("the payment service is down")


@dex.workflow(name="web-retrying")
async def retrying(ctx: dex.WorkflowContext) -> int:
    return await ctx.activity(flaky)


@dex.workflow(name="web-parent")
async def parent(ctx: dex.WorkflowContext) -> Any:
    return await ctx.child(checkout, 8)


def test_pending_activities_show_their_attempt_and_next_retry(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, retrying], [*ACTIVITIES, flaky])
    run_id = engine.start_workflow(retrying)
    engine.drain(advance_time=False)  # the first attempt fails; the retry waits an hour
    with client(create_app(engine)) as http:
        page = http.get(f"/runs/{run_id}").text
        assert 'id="pending"' in page and "web-flaky" in page
        assert "<td>2</td><td>waiting</td>" in page  # every store says which attempt comes next
        overview = http.get("/").text
        if not isinstance(engine.store, InMemoryAdapter):
            assert "retrying activity" in overview and run_id in overview
            assert "ConnectionError: the payment service is down" in overview  # its newest failure
        assert 'id="timeline"' in page and "pending" in page


@dex.workflow(name="web-remote")
async def remote(ctx: dex.WorkflowContext, image: str) -> Any:
    return await ctx.activity("resize-image", image)  # no Python process registers it (docs/reference/contract.md §13)


def test_a_task_for_a_remote_worker_shows_as_pending_on_the_run_page(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, remote], ACTIVITIES)
    run_id = engine.start_workflow(remote, "cat.png")
    engine.drain()  # nothing here runs it: the task waits for a remote worker
    with client(create_app(engine)) as http:
        page = http.get(f"/runs/{run_id}").text
        assert 'id="pending"' in page and "resize-image" in page
        polled = http.post("/v1/activity-tasks/poll", json={"worker_id": "w", "names": ["resize-image"], "max": 1})
        (task,) = polled.json()
        assert task["run_id"] == run_id and task["args"] == ["cat.png"]


def test_parent_and_children_link_to_each_other(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, parent], ACTIVITIES)
    run_id = engine.start_workflow(parent)
    engine.drain()
    child_id = next(r.run_id for r in engine.list_runs(workflow_name="web-checkout"))
    with client(create_app(engine)) as http:
        assert f'href="/runs/{child_id}"' in http.get(f"/runs/{run_id}").text
        assert f'href="/runs/{run_id}"' in http.get(f"/runs/{child_id}").text
        assert http.get(f"/v1/runs/{child_id}").json()["parent_run_id"] == run_id


def test_fork_from_the_api_and_from_the_run_page(make_engine: Any) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    source = engine.start_workflow(checkout, 1)
    engine.drain()
    with client(create_app(engine)) as http:
        assert "/v1/runs/{run_id}/fork" in http.get("/v1/openapi.json").json()["paths"]
        response = http.post(f"/v1/runs/{source}/fork", json={})
        assert response.status_code == 201 and response.json()["forked_from"] == source
        forked = response.json()["run_id"]
        assert http.get(f"/v1/runs/{forked}").json()["forked_from"] == source
        assert http.post(f"/v1/runs/{source}/fork", json={"at": -1}).json()["error"]["type"] == "BadRequest"
        not_a_point = http.post(f"/v1/runs/{source}/fork", json={"at": 2})  # a point its history has not
        assert not_a_point.status_code == 409 and "can be forked at" in not_a_point.json()["error"]["message"]
        assert http.post(f"/v1/runs/{source}/fork", json={"at": "x"}).status_code in (400, 422)
        assert http.post("/v1/runs/nope/fork").status_code == 404
        page = http.get(f"/runs/{forked}").text
        assert 'id="fork"' in page and f"/runs/{source}" in page  # the link back to the original
        moved = http.post(f"/runs/{source}/fork", headers={"origin": "http://127.0.0.1:8765"}, follow_redirects=False)
        assert moved.status_code == 303 and moved.headers["location"].startswith("/runs/")
    engine.drain()
    assert engine.wait(forked, timeout=5) == engine.wait(source, timeout=5)


@dex.workflow(name="web-shipping")
async def shipping_v1(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(charge_alias, 1)
    await ctx.wait_for_event("go")
    return first


@dex.workflow(name="web-shipping")
async def shipping_v2(ctx: dex.WorkflowContext) -> str:
    await ctx.sleep(timedelta(seconds=1))  # a deploy changed the first step, with no patch
    await ctx.wait_for_event("go")
    return "changed"


charge_alias = ACTIVITIES[0]


def test_a_held_run_shows_on_the_overview_and_its_page(make_engine: Any) -> None:
    v1 = make_engine([shipping_v1], ACTIVITIES)
    run_id = v1.start_workflow(shipping_v1)
    v1.drain()
    v2 = make_engine([shipping_v2], ACTIVITIES)
    v2.send_event(run_id, "go")
    v2.drain()
    assert v2.get_run(run_id).task_failure is not None  # held: its new code does not match
    with client(create_app(v2)) as http:
        overview = http.get("/").text
        assert "held run" in overview and run_id in overview and "NonDeterminismError" in overview
        page = http.get(f"/runs/{run_id}").text
        assert "Held: its workflow task keeps failing" in page
        assert http.get(f"/v1/runs/{run_id}").json()["task_failure"]["type"] == "NonDeterminismError"
