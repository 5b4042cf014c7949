"""What the worker SDKs' tests share (clients/go, clients/java): a real dex web app with a token
over a started engine that registers the workflows below and no activity, served on a loopback
port, and a check of the runs an SDK's tests report.

An SDK's own tests drive everything over HTTP (they start runs with ``POST /v1/runs``, cancel
them, read them back); each run they mean to end prints a line ``dex-run RUN_ID STATUS``, which
:func:`check_reported_runs` holds against the engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService
from dex.web import create_app
from tests.remote.support import app_server

TOKEN = "sdk-test-token"
LEASE = timedelta(seconds=2)  # short: an activity of 3 s completes only if the SDK heartbeats


@dex.workflow(name="sdk-call")
async def sdk_call(ctx: dex.WorkflowContext, name: str, args: list[Any], max_attempts: int = 1) -> Any:
    """Calls the remote activity ``name`` with ``args``, tried up to ``max_attempts`` times
    (10 ms apart unless the worker asks for another delay)."""
    retry = dex.RetryPolicy(max_attempts=max_attempts, initial_delay=0.01, max_delay=0.01)
    return await ctx.activity(name, *args, retry=retry)


@dex.workflow(name="sdk-fan-out")
async def sdk_fan_out(ctx: dex.WorkflowContext, name: str, count: int) -> list[Any]:
    """Calls ``name`` ``count`` times at once, with the index as its argument."""
    return list(await ctx.gather(*(ctx.activity(name, i) for i in range(count))))


@contextmanager
def served_for_sdk() -> Iterator[tuple[dex.Engine, str]]:
    """A started engine and the base URL of a dex web app over it (token :data:`TOKEN`)."""
    engine = dex.Engine(InMemoryAdapter(), workflows=[sdk_call, sdk_fan_out], poll_interval=0.02)
    with engine:
        service = ActivityTaskService(engine, poll_interval=0.2, lease=LEASE)
        with app_server(create_app(engine, token=TOKEN, activity_task_service=service)) as url:
            yield engine, url


REPORTED = re.compile(r"^dex-run (\S+) (\S+)$", re.MULTILINE)


def check_reported_runs(engine: dex.Engine, output: str, at_least: int) -> list[str]:
    """The runs an SDK's tests reported ended: each has the status it reported, as the engine
    sees it. Returns their ids."""
    reported = REPORTED.findall(output)
    assert len(reported) >= at_least, output[-4000:]
    for run_id, status in reported:
        assert engine.get_run(run_id).status is RunStatus(status), (run_id, status)
    return [run_id for run_id, _ in reported]
