"""The run page and ``GET /v1/runs/{run_id}/activity-steps`` show each activity step's attempts, on both
adapters: how many began, the newest failures with their times, the next retry of a step
still retrying; hostile failure texts are shown as text."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex
from dex.web import create_app
from tests.web.conftest import client

RETRY = dex.RetryPolicy(initial_delay=timedelta(seconds=3), randomization_factor=0, max_attempts=5)


@dex.activity(name="web-gateway", retry=RETRY)
def gateway(fail_until: int) -> str:
    attempt = dex.activity_context().attempt
    if attempt <= fail_until:
        raise ConnectionError(f"<script>alert({attempt})</script> nul \x00 timed out")
    return f"paid on attempt {attempt}"


@dex.workflow(name="web-pay")
async def pay(ctx: dex.WorkflowContext, fail_until: int) -> str:
    return await ctx.activity(gateway, fail_until)  # type: ignore[no-any-return]


def test_the_run_page_and_the_api_show_the_attempts_of_a_retried_step(make_engine: Any) -> None:
    engine = make_engine([pay], [gateway])
    run_id = engine.start_workflow(pay, 2)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "paid on attempt 3"
    with client(create_app(engine)) as http:
        page = http.get(f"/runs/{run_id}").text
        assert 'id="attempts"' in page
        row = page.split('<tr id="step-4">', 1)[1].split("</tr>", 1)[0]
        assert "<td>web-gateway</td>" in row and "3 attempts (2 failed)" in row
        assert row.count("<details") == 2 and row.index("attempt 2 failed at") < row.index("attempt 1 failed at")
        assert "&lt;script&gt;alert(2)&lt;/script&gt; nul \\x00 timed out" in row  # text, not markup
        assert "<script>alert" not in page
        assert "(attempt 3)" in page  # the timeline's bar says the step took three attempts
        document = http.get(f"/v1/runs/{run_id}/activity-steps").json()
        assert "activity_steps" not in http.get(f"/v1/runs/{run_id}").json()  # one row: steps are paged
    assert document["next_after"] is None  # the history was read to its end
    (step,) = document["activity_steps"]
    assert (step["seq"], step["name"], step["status"]) == (4, "web-gateway", "completed")
    assert (step["attempts"], step["failed"], step["lost"], step["next_retry_at"]) == (3, 2, 0, None)
    assert [f["attempt"] for f in step["recent_failures"]] == [2, 1]
    assert step["recent_failures"][0]["failure"]["message"] == "<script>alert(2)</script> nul \x00 timed out"


def test_a_step_still_retrying_shows_its_next_retry(make_engine: Any, clock: Any) -> None:
    engine = make_engine([pay], [gateway])
    run_id = engine.start_workflow(pay, 4)
    engine.drain(advance_time=False)  # attempt 1 fails; the next may begin in 3 s
    due = clock.now() + timedelta(seconds=3)
    with client(create_app(engine)) as http:
        row = http.get(f"/runs/{run_id}").text.split('<tr id="step-4">', 1)[1].split("</tr>", 1)[0]
        assert "retrying" in row and "1 attempt (1 failed)" in row
        assert f"next retry at {due.strftime('%Y-%m-%dT%H:%M:%S')}.000Z" in row
        (step,) = http.get(f"/v1/runs/{run_id}/activity-steps").json()["activity_steps"]
    assert (step["status"], step["attempts"], step["failed"]) == ("retrying", 1, 1)
    assert step["next_retry_at"] is not None and step["next_retry_at"].startswith(due.strftime("%Y-%m-%dT%H:%M:%S"))
