"""The dashboard's statements read the runs table through its indexes, never whole.

A schema gets 20,000 runs inserted in SQL (the shape of ``benchmarks/web_pages.py``: spread
over 30 days, mostly completed, two label keys), is analysed, and then the pages and API
calls are made through the app while every statement the adapter's connection runs is also
explained: no sequential scan of ``runs`` or ``history`` (the tables that grow with the data;
the task tables hold live tasks only and may be read whole). The timings over a million runs
are in BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.database import Database
from dex.web import create_app
from dex.web.app import Web
from dex.web.pg_insights import PostgresInsights
from tests.pg import fresh_schema, postgres_dsn
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, client, failing

pytestmark = pytest.mark.postgres
GROWING = {"runs", "history"}

BULK = """
INSERT INTO {s}.runs (run_id, workflow_name, queue, status, priority, labels, created_at, started_at,
    completed_at, last_seq)
SELECT 'bulk-' || lpad(i::text, 8, '0'), 'web-checkout', 'default',
       CASE WHEN i %% 50 = 7 THEN 'FAILED' WHEN i %% 100 = 5 THEN 'RUNNING' ELSE 'COMPLETED' END, 0,
       jsonb_build_object('shop', CASE WHEN i %% 2 = 0 THEN 'eu' ELSE 'us' END, 'n', (i %% 1000)::text),
       now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '1 hour',
       now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '1 hour',
       CASE WHEN i %% 100 = 5 THEN NULL
            ELSE now() - make_interval(secs => (%(n)s - i) * 2592000.0 / %(n)s) - interval '59 minutes' END,
       1
FROM generate_series(1, %(n)s) AS i
"""


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    yield plan.get("Node Type", ""), plan.get("Relation Name", "")
    for child in plan.get("Plans", ()):
        yield from scans(child)


class Explaining:
    """A connection that explains each statement before running it, keeping the plans."""

    def __init__(self, conn: psycopg.Connection, plans: list[tuple[str, list[tuple[str, str]]]]) -> None:
        self._conn, self._plans = conn, plans

    def execute(self, query: Any, params: Any = None) -> Any:
        explain = (
            b"EXPLAIN (FORMAT JSON) " + query if isinstance(query, bytes) else sql.SQL("EXPLAIN (FORMAT JSON) ") + query
        )
        plan = self._conn.execute(explain, params).fetchone()[0][0]["Plan"]
        text = query.decode() if isinstance(query, bytes) else query.as_string(self._conn)
        self._plans.append((text, list(scans(plan))))
        return self._conn.execute(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_pages_and_api_calls_never_scan_the_runs_table_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_web_plans") as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=2)
        try:
            engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
            done = engine.start_workflow(checkout, 1)
            engine.start_workflow(failing)
            engine.drain(advance_time=False)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL(BULK).format(s=sql.Identifier(schema)), {"n": 20_000})
                conn.execute(sql.SQL("ANALYZE {s}.runs").format(s=sql.Identifier(schema)))
            plans: list[tuple[str, list[tuple[str, str]]]] = []
            original = Database.statement

            @contextmanager
            def explained(db: Database, kept: bool = False) -> Iterator[Any]:
                with original(db, kept) as conn:
                    yield Explaining(conn, plans)

            # every statement of the adapter's parts, and the insights' reads, go through it
            monkeypatch.setattr(Database, "statement", explained)
            app = create_app(engine)
            web: Web = app.state.web
            web.insights = PostgresInsights(adapter, sample=500)  # a sample well below the table's size
            with client(app) as http:
                cursor = http.get("/v1/runs", params={"limit": 20}).json()["next_cursor"]
                for url in (
                    "/",
                    "/runs",
                    f"/runs?cursor={cursor}",
                    "/runs?label=shop%3Deu",
                    "/runs?status=FAILED",
                    f"/runs?parent_run_id={done}",  # a run's children: runs_children
                    "/runs?level=all",
                    f"/runs/{done}",
                    f"/v1/runs/{done}/history",
                    f"/v1/runs/{done}/history?limit=2&after=1",  # a page: Store.load_history_after
                    f"/runs/{done}?from=3",
                    f"/v1/runs/{done}",
                    f"/v1/runs/{done}/activity-steps?limit=1",  # Store.step_attempts of the page's steps
                ):
                    assert http.get(url).status_code == 200, url
        finally:
            adapter.close()
    assert len(plans) >= 8
    whole = [(text, node) for text, nodes in plans for node in nodes if node[0] == "Seq Scan" and node[1] in GROWING]
    assert whole == []
