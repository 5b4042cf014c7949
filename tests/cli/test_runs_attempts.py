"""`dex runs show`: each activity step's attempts — the count, the newest failures with their
times, the next retry of a step still retrying — in the text and in the JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.cli.conftest import T0, World

pytestmark = pytest.mark.postgres


@dex.activity(
    name="cli-charge", retry=dex.RetryPolicy(initial_delay=timedelta(seconds=2), randomization_factor=0, max_attempts=5)
)
def charge(fail_until: int) -> str:
    attempt = dex.activity_context().attempt
    if attempt <= fail_until:
        raise ConnectionError(f"gateway timeout \x1b[31m on attempt {attempt}")
    return f"charged on attempt {attempt}"


@dex.workflow(name="cli-pay")
async def pay(ctx: dex.WorkflowContext, fail_until: int) -> str:
    return await ctx.activity(charge, fail_until)  # type: ignore[no-any-return]


@pytest.fixture
def engine(world: World) -> Iterator[dex.Engine]:
    adapter = PostgresAdapter(world.dsn, schema=world.schema, clock=world.clock, max_connections=2)
    try:
        yield dex.Engine(adapter, workflows=[pay], activities=[charge])
    finally:
        adapter.close()


def test_show_gives_each_step_s_attempts_and_failures(world: World, engine: dex.Engine) -> None:
    run_id = engine.start_workflow(pay, 2)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "charged on attempt 3"
    result = world.invoke("runs", "show", run_id)
    assert result.exit_code == 0, result.output
    section = result.stdout.split("\nactivity steps: 1\n", 1)[1].split("\n\nhistory: ", 1)[0].splitlines()
    assert section[0].split() == ["#", "ACTIVITY", "STATUS", "ATTEMPTS", "NEXT"]
    assert section[1].split() == ["4", "cli-charge", "completed", "3", "attempts", "(2", "failed)"]
    # newest first, each with its time; the escape sequence of the message is shown as text
    assert section[2] == (
        "    attempt 2 failed at 2025-03-01T09:00:02.000Z: ConnectionError: gateway timeout \\x1b[31m on attempt 2"
    )
    assert section[3].startswith("    attempt 1 failed at 2025-03-01T09:00:00.000Z: ConnectionError:")
    assert len(section) == 4


def test_show_gives_the_next_retry_of_a_step_still_retrying(world: World, engine: dex.Engine) -> None:
    run_id = engine.start_workflow(pay, 4)
    engine.drain(advance_time=False)  # attempt 1 fails; the next waits 2 s
    text = world.invoke("runs", "show", run_id).stdout
    assert "4  cli-charge  retrying  1 attempt (1 failed)  next retry at 2025-03-01T09:00:02.000Z\n" in text
    document = json.loads(world.invoke("runs", "show", run_id, "--json").stdout)
    (step,) = document["activity_steps"]
    assert {k: step[k] for k in ("seq", "name", "status", "attempts", "failed", "lost")} == {
        "seq": 4,
        "name": "cli-charge",
        "status": "retrying",
        "attempts": 1,
        "failed": 1,
        "lost": 0,
    }
    assert step["next_retry_at"] == "2025-03-01T09:00:02Z"
    assert step["scheduled_at"] == "2025-03-01T09:00:00Z" and step["ended_at"] is None
    (failure,) = step["recent_failures"]
    assert (failure["attempt"], failure["kind"], failure["at"]) == (1, "failed", "2025-03-01T09:00:00Z")
    assert failure["failure"]["type"] == "ConnectionError"
    assert failure["failure"]["message"] == "gateway timeout \x1b[31m on attempt 1"  # JSON carries it whole
    assert T0 == world.clock.now()
