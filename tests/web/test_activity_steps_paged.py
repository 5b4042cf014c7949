"""``GET /v1/runs/{run_id}/activity-steps``: a run's activity steps a page at a time, on both
adapters. ``after`` is a sequence number and ``next_after`` leads on until the history has been
read to its end; the pages together are the run's steps as ``Engine.activity_steps`` gives them,
each once, and ``GET /v1/runs/{run_id}`` no longer carries them."""

from __future__ import annotations

from typing import Any

import dex
from dex.views.attempts import step_json
from dex.web import create_app
from tests.web.conftest import client


@dex.activity(name="paged-charge")
def charge(amount: int) -> str:
    return f"charged {amount}"


@dex.workflow(name="paged-steps")
async def in_turn(ctx: dex.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.activity(charge, i)
    return n


@dex.workflow(name="paged-fan-out")
async def fan_out(ctx: dex.WorkflowContext, n: int) -> int:
    await ctx.gather(*(ctx.activity(charge, i) for i in range(n)))
    return n


def _pages(http: Any, run_id: str, limit: int) -> list[dict[str, Any]]:
    pages, after = [], 0
    while after is not None:
        page = http.get(f"/v1/runs/{run_id}/activity-steps", params={"after": after, "limit": limit})
        assert page.status_code == 200, page.text
        pages.append(page.json())
        after = pages[-1]["next_after"]
    return pages


def test_the_pages_are_the_runs_steps_each_once(make_engine: Any) -> None:
    engine = make_engine([in_turn, fan_out], [charge])
    runs = [engine.start_workflow(in_turn, 7), engine.start_workflow(fan_out, 6)]
    engine.drain()
    with client(create_app(engine)) as http:
        for run_id in runs:
            whole = [step_json(step) for step in engine.activity_steps(run_id)]
            assert len(whole) in (6, 7) and {step["status"] for step in whole} == {"completed"}
            pages = _pages(http, run_id, 3)
            assert [step for page in pages for step in page["activity_steps"]] == whole
            assert all(len(page["activity_steps"]) <= 3 for page in pages)
            assert len(pages) in (-(-len(whole) // 3), -(-len(whole) // 3) + 1)  # perhaps a last, empty one
            assert _pages(http, run_id, 500) == [{"activity_steps": whole, "next_after": None}]
            assert "activity_steps" not in http.get(f"/v1/runs/{run_id}").json()


def test_the_page_is_checked_and_an_unknown_run_is_not_found(make_engine: Any) -> None:
    engine = make_engine([in_turn], [charge])
    run_id = engine.start_workflow(in_turn, 1)
    engine.drain()
    with client(create_app(engine)) as http:
        for query in ("limit=0", "limit=501", "after=-1", "limit=x"):
            answer = http.get(f"/v1/runs/{run_id}/activity-steps?{query}")
            assert answer.status_code == 400, query
        assert http.get("/v1/runs/no-such-run/activity-steps").status_code == 404
        beyond = http.get(f"/v1/runs/{run_id}/activity-steps?after=1000").json()
        assert beyond == {"activity_steps": [], "next_after": None}
