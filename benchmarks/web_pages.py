"""The dashboard and the JSON API over a million runs: each page and API call, timed.

    python -m benchmarks.web_pages [--runs 1000000] [--repeat 7] [--long-run 50000]

A fresh schema gets a few runs made by an engine (a completed one, a failed one, one waiting
on an event, so the run pages have real histories), then ``--runs`` more rows in ``runs``
inserted by one SQL statement: spread evenly over the last 30 days (so the last hour holds
about 1,400 of a million), 96% COMPLETED, 2% FAILED, 1% CANCELLED, 1% RUNNING, two workflow
names, labels ``{"shop": "eu"|"us", "n": "0".."999"}``; then ``ANALYZE``. (Only ``runs``
grows: the pages read histories by run id, on the primary key.) Each request goes through
the app in process (Starlette's test client over ``dex.web.create_app(adapter)``: routing,
the store's queries, the templates, no network); after one warm-up, the median and the
slowest of ``--repeat`` requests are reported, in milliseconds. ``--long-run N`` then times
the pages of one run of N activities: its run page, 500 events a page, its history through
the API, whole and a page of 1,000 events, the run through the API and a page of its activity
steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import psycopg
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from tests.pg import fresh_schema, postgres_dsn

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dex.web import create_app


@dex.activity(name="bench-charge")
def charge(amount: int) -> str:
    return f"charged {amount}"


@dex.activity(name="bench-explode", retry=dex.RetryPolicy(max_attempts=1))
def explode() -> None:
    raise ValueError("boom")


@dex.workflow(name="bench-order")
async def order(ctx: dex.WorkflowContext, amount: int) -> dict[str, Any]:
    receipt = await ctx.activity(charge, amount)
    return {"receipt": receipt}


@dex.workflow(name="bench-failing")
async def failing(ctx: dex.WorkflowContext) -> None:
    await ctx.activity(explode)


@dex.workflow(name="bench-waiting")
async def waiting(ctx: dex.WorkflowContext) -> Any:
    await ctx.activity(charge, 1)
    return await ctx.wait_for_event("go")


@dex.workflow(name="bench-long")
async def long_run(ctx: dex.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.activity(charge, i)
    return n


def long_history(engine: dex.Engine, http: TestClient, activities: int, repeat: int) -> None:
    """The run page and the history API over one run of ``activities`` activities (four events
    each): its first and last page, the API whole and a page of 1,000 events, the run's own
    answer and a page of its activity steps (the first, and one halfway)."""
    began = time.monotonic()
    engine.start()  # as a deployment runs it: inline activities, the executor kept between tasks
    try:
        run_id = engine.start_workflow(long_run, activities)
        engine.wait(run_id, timeout=3600)
    finally:
        engine.stop()
    events = len(engine.store.load_history(run_id))
    print(f"\none run of {activities:,} activities ({events:,} events) ran in {time.monotonic() - began:.1f} s")
    print("| request | median ms | slowest ms | bytes |")
    print("|---|---|---|---|")
    for name, url in (
        ("run page (first page of its history)", f"/runs/{run_id}"),
        ("run page (last page)", f"/runs/{run_id}?from={events}"),
        ("GET /v1/runs/{id}/history (whole)", f"/v1/runs/{run_id}/history"),
        ("GET /v1/runs/{id}/history?limit=1000&after=...", f"/v1/runs/{run_id}/history?limit=1000&after={events // 2}"),
        ("GET /v1/runs/{id}", f"/v1/runs/{run_id}"),
        ("GET /v1/runs/{id}/activity-steps (first page)", f"/v1/runs/{run_id}/activity-steps"),
        ("GET /v1/runs/{id}/activity-steps?after=...", f"/v1/runs/{run_id}/activity-steps?after={events // 2}"),
    ):
        median, slowest, status = timed(http, url, repeat)
        mark = "" if status == 200 else f" (status {status})"
        print(f"| {name}{mark} | {median:.1f} | {slowest:.1f} | {len(http.get(url).content):,} |")


BULK = """
INSERT INTO {s}.runs (run_id, workflow_name, queue, status, priority, labels, created_at, started_at,
    completed_at, last_seq)
SELECT 'bulk-' || lpad(i::text, 8, '0'),
       CASE WHEN i %% 50 = 7 THEN 'bench-failing' ELSE 'bench-order' END,
       'default',
       CASE WHEN i %% 50 = 7 THEN 'FAILED' WHEN i %% 100 = 3 THEN 'CANCELLED' WHEN i %% 100 = 5 THEN 'RUNNING'
            ELSE 'COMPLETED' END,
       0,
       jsonb_build_object('shop', CASE WHEN i %% 2 = 0 THEN 'eu' ELSE 'us' END, 'n', (i %% 1000)::text),
       now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '1 minute',
       now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '1 minute',
       CASE WHEN i %% 100 = 5 THEN NULL
            ELSE now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '58 seconds' END,
       1
FROM generate_series(1, %(n)s) AS i
"""


def fill(dsn: str, schema: str, runs: int) -> None:
    began = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(BULK).format(s=sql.Identifier(schema)), {"n": runs})
        conn.execute(sql.SQL("ANALYZE {s}.runs").format(s=sql.Identifier(schema)))
    print(f"inserted {runs:,} runs in {time.monotonic() - began:.1f} s")


def timed(http: TestClient, url: str, repeat: int) -> tuple[float, float, int]:
    http.get(url)  # warm-up: the plan cache, the templates
    samples = []
    status = 0
    for _ in range(repeat):
        began = time.perf_counter()
        response = http.get(url)
        samples.append((time.perf_counter() - began) * 1000)
        status = response.status_code
    return statistics.median(samples), max(samples), status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--long-run", type=int, default=0, metavar="N", help="also time the pages of one run of N activities"
    )
    args = parser.parse_args()
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_bench_web") as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=4)
        try:
            engine = dex.Engine(adapter, workflows=[order, failing, waiting, long_run], activities=[charge, explode])
            done = engine.start_workflow(order, 5, labels={"shop": "eu"})
            bad = engine.start_workflow(failing)
            live = engine.start_workflow(waiting, labels={"shop": "eu"})
            engine.drain(advance_time=False)
            fill(dsn, schema, args.runs)
            http = TestClient(create_app(adapter), base_url="http://127.0.0.1")
            cursor = None
            for _ in range(20):  # the 21st page, by following the cursors
                page = http.get("/v1/runs", params={"limit": 50, **({"cursor": cursor} if cursor else {})}).json()
                cursor = page["next_cursor"]
            urls = [
                ("overview", "/"),
                ("runs page", "/runs"),
                ("runs page 21 (cursor)", f"/runs?cursor={cursor}"),
                ("runs: status FAILED", "/runs?status=FAILED"),
                ("runs: status RUNNING", "/runs?status=RUNNING"),
                ("runs: status SUSPENDED (none)", "/runs?status=SUSPENDED"),
                ("runs: label shop=eu", "/runs?label=shop%3Deu"),
                ("runs: label n=7 (0.1%)", "/runs?label=n%3D7"),
                ("runs: workflow bench-failing", "/runs?workflow=bench-failing"),
                (
                    "runs: created in one hour 10 days ago",
                    "/runs?created_after=" + _ago(10 * 24) + "&created_before=" + _ago(10 * 24 - 1),
                ),
                ("run page (completed)", f"/runs/{done}"),
                ("run page (failed)", f"/runs/{bad}"),
                ("run page (waiting)", f"/runs/{live}"),
                ("queues page", "/queues"),
                ("schedules page", "/schedules"),
                ("GET /v1/runs", "/v1/runs"),
                ("GET /v1/runs page 21 (cursor)", f"/v1/runs?cursor={cursor}"),
                ("GET /v1/runs?status=FAILED", "/v1/runs?status=FAILED"),
                ("GET /v1/runs?label=n=7", "/v1/runs?label=n%3D7"),
                ("GET /v1/runs/{id}", f"/v1/runs/{done}"),
                ("GET /v1/runs/{id}/history", f"/v1/runs/{done}/history"),
                ("GET /v1/queues", "/v1/queues"),
                ("GET /v1/schedules", "/v1/schedules"),
                ("GET /v1/openapi.json", "/v1/openapi.json"),
            ]
            print(f"| request ({args.runs:,} runs) | median ms | slowest ms |")
            print("|---|---|---|")
            for name, url in urls:
                median, slowest, status = timed(http, url, args.repeat)
                mark = "" if status == 200 else f" (status {status})"
                print(f"| {name}{mark} | {median:.1f} | {slowest:.1f} |")
            if args.long_run:
                long_history(engine, http, args.long_run, min(args.repeat, 3))
        finally:
            adapter.close()


def _ago(hours: int) -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    main()
