"""A change of a queue's rate limit that fails midway, on PostgreSQL: the queue's row is
updated first, then its start slots; when the database fails between the two (a trigger on
the slots raises), the transaction is undone whole: the queue keeps its limit and its slots,
and the engine runs the next workflow (docs/reference/contract.md §15)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.domain.queue_limits import RateLimit
from dex.testing import VirtualClock
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres

SECOND = timedelta(seconds=1)


@dex.workflow(name="after-fault")
async def probe(ctx: dex.WorkflowContext, n: int) -> int:
    return n + 1


def test_a_rate_limit_change_that_fails_midway_changes_nothing() -> None:
    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, clock=VirtualClock())
        engine = dex.Engine(adapter, workflows=[probe])
        try:
            engine.create_queue("api", "activity", 5, rate_limit=(2, SECOND))
            s = sql.Identifier(schema)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS"
                        " $$ BEGIN RAISE EXCEPTION 'the disk is full'; END $$"
                    ).format(s=s)
                )
                conn.execute(
                    sql.SQL(
                        "CREATE TRIGGER refuse BEFORE INSERT ON {s}.queue_start_shares FOR EACH ROW EXECUTE FUNCTION {s}.refuse()"
                    ).format(s=s)
                )
                with pytest.raises(psycopg.Error, match="the disk is full"):
                    engine.set_queue_rate_limit("api", "activity", (5, SECOND))
                info = next(q for q in engine.list_queues() if q.name == "api")
                assert info.rate_limit == RateLimit(2, SECOND)
                shares = conn.execute(
                    sql.SQL(
                        "SELECT share, slots FROM {s}.queue_start_shares WHERE queue = 'api' ORDER BY share"
                    ).format(s=s)
                ).fetchall()
                assert shares == [(0, 2)]  # one share of the two slots of the limit that stands
                conn.execute(sql.SQL("DROP TRIGGER refuse ON {s}.queue_start_shares").format(s=s))
            engine.set_queue_rate_limit("api", "activity", (5, SECOND))
            assert next(q for q in engine.list_queues() if q.name == "api").rate_limit == (5, SECOND)
            run_id = engine.start_workflow(probe, 41)
            engine.drain()
            assert engine.wait(run_id, timeout=5) == 42
        finally:
            engine.stop(timeout=5)
            adapter.close()
