"""Workflows and activities that worker processes and the tests driving them share.

Every activity execution writes a row to a side table, ``<schema>.executions`` (run id, step,
attempt, process id), in a transaction of its own and before it does its work. So a test
can count how often each step ran, and by whom, whatever became of the worker: a process
killed mid-activity leaves its row behind.

A worker process calls :func:`configure` with the database and schema before it starts its
engine; the test process calls :func:`create_side_table` once per schema.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import psycopg
from psycopg import sql

import dex

WORKFLOW_QUEUE = "procs"
ACTIVITY_QUEUE = "procs-acts"

_target: tuple[str, str] | None = None  # (dsn, schema) of the side table


def configure(dsn: str, schema: str) -> None:
    """Where the activities of this process record their executions."""
    global _target
    _target = (dsn, schema)


def create_side_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.executions ("
                " run_id text NOT NULL, step integer NOT NULL, attempt integer NOT NULL, pid integer NOT NULL,"
                " at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema))
        )


def _record(step: int) -> None:
    if _target is None:
        raise RuntimeError("workload.configure() was not called in this process")
    dsn, schema = _target
    context = dex.activity_context()
    # a fresh connection each time: the side table must not depend on the engine's pool, and
    # a database restart costs this execution (a retry), not the rest of the process
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.executions (run_id, step, attempt, pid) VALUES (%s, %s, %s, %s)").format(
                sql.Identifier(schema)
            ),
            [context.run_id, step, context.attempt, os.getpid()],
        )


def _step(value: int, step: int, pause: float) -> int:
    _record(step)
    time.sleep(pause)
    return value * 10 + step


# Two copies of one step that differ in their lease: ``step`` holds its task for long enough
# that a healthy worker never loses it (so each step runs exactly once), ``short_step`` for
# two seconds (so a task whose worker died, or whose outcome was lost in a database restart,
# is taken over soon).
_RETRY = dex.RetryPolicy(initial_delay=timedelta(milliseconds=200), max_delay=timedelta(seconds=1), max_attempts=50)


@dex.activity(name="step", queue=ACTIVITY_QUEUE, retry=_RETRY, lock_timeout=timedelta(seconds=60))
def step(value: int, step: int, pause: float) -> int:
    return _step(value, step, pause)


@dex.activity(name="short-step", queue=ACTIVITY_QUEUE, retry=_RETRY, lock_timeout=timedelta(seconds=2))
def short_step(value: int, step: int, pause: float) -> int:
    return _step(value, step, pause)


@dex.activity(name="long-step", queue=ACTIVITY_QUEUE, retry=_RETRY, lock_timeout=timedelta(minutes=5))
def long_step(value: int, first_pause: float) -> int:
    """A long first attempt (``first_pause`` seconds; later attempts are quick) under a
    five-minute ``lock_timeout``: its task moves within the short activity lease if its worker dies."""
    _record(1)
    if dex.activity_context().attempt == 1:
        time.sleep(first_pause)
    return value * 10 + 1


@dex.workflow(name="long-job", queue=WORKFLOW_QUEUE)
async def long_job(ctx: dex.WorkflowContext, n: int, first_pause: float) -> int:
    return await ctx.activity(long_step, n, first_pause)  # type: ignore[no-any-return]


@dex.workflow(name="pipeline", queue=WORKFLOW_QUEUE)
async def pipeline(ctx: dex.WorkflowContext, n: int, pause: float, activity: str) -> list[int]:
    """Step 1, then steps 2 and 3 at once: three activities in two workflow tasks."""
    first = await ctx.activity(activity, n, 1, pause)
    second, third = await ctx.gather(ctx.activity(activity, first, 2, pause), ctx.activity(activity, first, 3, pause))
    return [first, second, third]


def expected(n: int) -> list[int]:
    """What ``pipeline(n, ...)`` returns."""
    first = n * 10 + 1
    return [first, first * 10 + 2, first * 10 + 3]


STEPS = (1, 2, 3)
WORKFLOWS = [pipeline, long_job]
ACTIVITIES = [step, short_step, long_step]
