"""Any schema name PostgreSQL takes as a quoted identifier works.

The schema's name reaches SQL only through ``sql.Identifier``, also inside the function
bodies the migrations create, whose ``$$`` quotes a name with ``$$`` in it used to end early.
The one refused name is one with ``%``, which psycopg would read as a placeholder: it gets a
clear ValueError at ``PostgresAdapter(...)``, before anything is sent to the server.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter, migrate
from dex.adapters.postgres.migrations import MIGRATIONS
from dex.adapters.postgres.schema import dollar_quoted
from tests.pg import drop_schema

pytestmark = pytest.mark.postgres


@dex.activity
def double(x: int) -> int:
    return 2 * x


@dex.workflow
async def doubler(ctx: dex.WorkflowContext, x: int) -> int:
    await ctx.sleep(0)  # a timer too: the scheduler's statements
    return await ctx.activity(double, x)  # type: ignore[no-any-return]


NAMES = {
    "dollar quotes": 'we$$ird "name"',
    "the dollar tag itself": "$dex$ and $$ and $dex1$",
    "semicolons": "semi;colon'; DROP TABLE x; --",
    "quotes": 'it\'s "quoted"',
    "braces and backslash": "{s} \\ {}",
    "non-ASCII": "schéma ✓",
}


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_a_schema_with_an_unusual_name_migrates_and_runs(pg_dsn: str, name: str) -> None:
    schema = f"{name} {uuid.uuid4().hex[:6]}"
    try:
        adapter = PostgresAdapter(pg_dsn, schema=schema, migrate=True)
        try:
            with dex.Engine(adapter, workflows=[doubler], activities=[double], poll_interval=0.01) as engine:
                run_ids = [engine.start_workflow(doubler, i) for i in range(3)]
                assert [engine.wait(r, timeout=30) for r in run_ids] == [0, 2, 4]
            assert migrate(pg_dsn, schema) == MIGRATIONS[-1][0]  # again: nothing to do, no error
        finally:
            adapter.close()
        with psycopg.connect(pg_dsn) as conn:  # the objects landed in that schema, by that name
            functions = conn.execute(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
                [schema],
            ).fetchall()
        assert sorted(functions) == [
            ("complete_activities",),
            ("create_run",),
            ("outbox_activity_task",),  # the Kafka dispatch's triggers call these (migration 17)
            ("outbox_workflow_task",),
            ("share_free",),  # the rate limits' shares of start slots (migration 19)
            ("share_stamped",),
        ]
    finally:
        drop_schema(pg_dsn, schema)
    # and a schema with an ordinary name next to it is unaffected
    healthy = f"dex_test_{uuid.uuid4().hex[:8]}"
    try:
        adapter = PostgresAdapter(pg_dsn, schema=healthy)
        with dex.Engine(adapter, workflows=[doubler], activities=[double], poll_interval=0.01) as engine:
            assert engine.wait(engine.start_workflow(doubler, 5), timeout=30) == 10
        adapter.close()
    finally:
        drop_schema(pg_dsn, healthy)


@pytest.mark.parametrize("name", ["50%", "%s", "a%%b"])
def test_a_schema_name_with_a_percent_sign_is_refused_clearly(pg_dsn: str, name: str) -> None:
    with pytest.raises(ValueError, match="contains '%'"):
        PostgresAdapter(pg_dsn, schema=name)
    with psycopg.connect(pg_dsn) as conn:  # refused before anything was created
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [name]).fetchone() is None


def test_the_dollar_tag_leaves_released_function_bodies_unchanged() -> None:
    """Migrations are history: only the quoting changes, never the body between the quotes."""
    for _version, statements in MIGRATIONS:
        for statement in statements:
            for schema in ("dex", 'we$$ird "name"', "$dex$"):
                quoted = dollar_quoted(statement, schema)
                if "$$" not in statement:
                    assert quoted == statement
                    continue
                tag = quoted[quoted.index("$dex") : quoted.index("$", quoted.index("$dex") + 1) + 1]
                assert tag not in schema
                assert quoted.replace(tag, "$$") == statement
