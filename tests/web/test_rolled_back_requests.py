"""A request whose transaction rolls back leaves its pooled connection as good as it was.

psycopg answers a rollback with ``DEALLOCATE ALL`` once it has prepared statements of its own on
the connection. That used to drop the start statement dex had prepared there itself, and from
then on every schedule trigger on that connection was a 500 ``InFailedSqlTransaction`` (its
second try ran inside the aborted transaction). The start's statement is now sent unnamed
(``dex.adapters.postgres.direct``): here every pooled connection sees a rolled-back request
(cancelling an ended run: the documented 409) after psycopg prepared statements on it, and
each trigger afterwards is a 201 whose run completes, as does a healthy run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.web import create_app
from tests.pg import fresh_schema, postgres_dsn
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, client

pytestmark = pytest.mark.postgres
POOL = 4


@pytest.fixture
def adapter() -> Iterator[PostgresAdapter]:
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_web_rollback") as schema:
        # every connection open from the start: the pool hands them out in turn
        made = PostgresAdapter(dsn, schema=schema, min_connections=POOL, max_connections=POOL)
        try:
            yield made
        finally:
            made.close()


def test_a_rolled_back_request_leaves_schedule_triggers_working(adapter: PostgresAdapter) -> None:
    nightly = dex.Schedule("web-rollback-nightly", checkout, cron="0 3 * * *", args=(5,))
    engine = dex.Engine(adapter, WORKFLOWS, ACTIVITIES, schedules=[nightly])
    try:
        engine.drain(advance_time=False)
        ended = engine.start_workflow(checkout, 1)
        engine.drain(advance_time=False)
        triggered: list[str] = []
        with client(create_app(engine)) as http:
            # psycopg prepares a statement once it has run five times on a connection: the
            # trigger's own UPDATE, here on every connection of the pool
            for _ in range(POOL * 6):
                answer = http.post("/v1/schedules/web-rollback-nightly/trigger")
                assert answer.status_code == 201, answer.text
                triggered.append(answer.json()["run_id"])
            # the pool hands its connections out in turn, and a request may take more than
            # one: so many reads between the rolled-back request and the trigger that, over the
            # rounds, the trigger lands on every connection right after the rollback
            for reads in range(POOL * 3):
                assert http.post(f"/v1/runs/{ended}/cancel").status_code == 409  # rolled back
                for _ in range(reads):
                    assert http.get("/v1/schedules/web-rollback-nightly").status_code == 200
                answer = http.post("/v1/schedules/web-rollback-nightly/trigger")
                assert answer.status_code == 201, answer.text
                triggered.append(answer.json()["run_id"])
            engine.drain(advance_time=False)
            for run_id in dict.fromkeys(triggered):
                run = http.get(f"/v1/runs/{run_id}").json()
                assert run["status"] == "COMPLETED", run
            healthy = http.post("/v1/runs", json={"workflow": "web-checkout", "args": [3]})
            assert healthy.status_code == 201, healthy.text
            engine.drain(advance_time=False)
            assert engine.wait(healthy.json()["run_id"], timeout=5) == {"receipt": "charged 3", "amount": 3}
    finally:
        engine.stop(timeout=5)
