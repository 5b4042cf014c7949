"""The runs list (page and ``GET /v1/runs``) on both adapters: top-level runs by default, each
with a link to its children and their count; every level with ``level=all``; a run's children
with ``parent_run_id``; the instance id shown; labels as filters (``label=KEY=VALUE``, as
``Engine.list_runs(labels=)``)."""

from __future__ import annotations

import re
from typing import Any

import dex
from dex.app.ports.store import RunFilter
from dex.web import create_app
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, client


@dex.workflow(name="web-fan-out")
async def fan_out(ctx: dex.WorkflowContext, n: int) -> list[Any]:
    return [await ctx.child(checkout, i) for i in range(n)]


def _ids(answer: Any) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [run["run_id"] for run in answer.json()["runs"]]


def test_the_store_lists_a_runs_children_and_the_top_level_runs(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, fan_out], ACTIVITIES)
    parent = engine.start_workflow(fan_out, 3, instance_id="batch-7")
    alone = engine.start_workflow(checkout, 1)
    engine.drain()
    children = engine.store.list_runs(RunFilter(parent_run_id=parent))
    assert len(children) == 3 and {child.parent_run_id for child in children} == {parent}
    assert {run.run_id for run in engine.store.list_runs(RunFilter(top_level=True))} == {parent, alone}
    assert engine.store.list_runs(RunFilter(parent_run_id=alone)) == []
    assert len(engine.store.list_runs(RunFilter())) == 5  # the default filter still lists every run


def test_the_api_lists_top_level_runs_by_default_and_children_on_request(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, fan_out], ACTIVITIES)
    parent = engine.start_workflow(fan_out, 2)
    alone = engine.start_workflow(checkout, 1)
    engine.drain()
    children = {run.run_id for run in engine.store.list_runs(RunFilter(parent_run_id=parent))}
    with client(create_app(engine)) as http:
        assert set(_ids(http.get("/v1/runs"))) == {parent, alone}
        assert set(_ids(http.get("/v1/runs", params={"level": "all"}))) == {parent, alone, *children}
        assert set(_ids(http.get("/v1/runs", params={"parent_run_id": parent}))) == children
        # a filter searches the level asked for: the children's workflow is found at every level
        assert _ids(http.get("/v1/runs", params={"workflow": "web-checkout"})) == [alone]
        found = _ids(http.get("/v1/runs", params={"workflow": "web-checkout", "level": "all"}))
        assert set(found) == {alone, *children}
        refused = http.get("/v1/runs", params={"level": "children"})
        assert refused.status_code == 400 and "level" in refused.json()["error"]["message"]
        # the filters are in the OpenAPI document
        listed = http.get("/v1/openapi.json").json()["paths"]["/v1/runs"]["get"]["parameters"]
        assert {"parent_run_id", "level", "label", "instance_id"} <= {param["name"] for param in listed}


def test_the_page_nests_children_under_their_parent_and_shows_instance_ids(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, fan_out], ACTIVITIES)
    parent = engine.start_workflow(fan_out, 3, instance_id="batch-7")
    alone = engine.start_workflow(checkout, 1, instance_id="order-42")
    engine.drain()
    children = {run.run_id for run in engine.store.list_runs(RunFilter(parent_run_id=parent))}
    with client(create_app(engine)) as http:
        page = http.get("/runs").text
        assert parent in page and alone in page and not any(child in page for child in children)
        assert "<th>Instance id</th>" in page and '<td class="instance">batch-7</td>' in page
        assert '<td class="instance">order-42</td>' in page
        link = re.search(r'<td class="children"><a href="([^"]+)">([^<]+)</a></td>', page)
        assert link is not None and link.group(2) == "3 children"
        assert link.group(1) == f"/runs?parent_run_id={parent}"
        nested = http.get(link.group(1)).text
        assert all(child in nested for child in children) and "The children of run" in nested
        everything = http.get("/runs", params={"level": "all"}).text
        assert all(run_id in everything for run_id in (parent, alone, *children)) and "child of" in everything
        # a filter that matches only children says where to look
        empty = http.get("/runs", params={"workflow": "web-fan-out", "instance_id": "nope"}).text
        assert "No runs match among the top-level runs" in empty and "level=all" in empty


def test_labels_filter_the_list_and_each_label_shown_is_a_filter(make_engine: Any) -> None:
    engine = make_engine(WORKFLOWS, ACTIVITIES)
    blue = engine.start_workflow(checkout, 1, labels={"colour": "blue", "shop": "eu"})
    red = engine.start_workflow(checkout, 2, labels={"colour": "red", "shop": "eu"})
    with client(create_app(engine)) as http:
        assert _ids(http.get("/v1/runs", params={"label": "colour=blue"})) == [blue]
        both = http.get("/v1/runs", params=[("label", "shop=eu"), ("label", "colour=red")])
        assert _ids(both) == [red]
        page = http.get("/runs").text
        assert 'href="/runs?label=colour%3Dblue"' in page
        filtered = http.get("/runs?label=colour%3Dblue").text
        assert blue in filtered and red not in filtered
        assert 'value="colour=blue"' in filtered  # the form keeps every label filter
