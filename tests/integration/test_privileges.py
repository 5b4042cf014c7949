"""dex needs no more than a role that owns its schema (docs/how-to/operate.md, "Database privileges")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import dex
from dex.adapters.postgres import DatabasePermissionError, PostgresAdapter
from tests.pg import postgres_dsn

pytestmark = pytest.mark.postgres


@dex.activity
def double(x: int) -> int:
    return 2 * x


@dex.workflow
async def doubler(ctx: dex.WorkflowContext, x: int) -> int:
    await ctx.sleep(0)
    return await ctx.activity(double, x)  # type: ignore[no-any-return]


@pytest.fixture
def restricted_role() -> Iterator[tuple[str, str]]:
    """A role with LOGIN and nothing else, owning one empty schema; the database denies PUBLIC."""
    admin_dsn = postgres_dsn()
    role = f"dex_app_{uuid.uuid4().hex[:8]}"
    schema = f"{role}_schema"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'secret'").format(sql.Identifier(role)))
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role)))
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    params = conninfo_to_dict(admin_dsn)
    params.update(user=role, password="secret")
    try:
        yield make_conninfo(**params), schema
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_that_only_owns_its_schema_can_migrate_and_run(restricted_role: tuple[str, str]) -> None:
    dsn, schema = restricted_role
    with psycopg.connect(dsn) as conn:  # the role really is restricted
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE SCHEMA somewhere_else")
    adapter = PostgresAdapter(dsn, schema=schema)  # migrates: tables, partitions, indexes
    try:
        engine = dex.Engine(adapter, workflows=[doubler], activities=[double], poll_interval=0.01)
        with engine:
            run_ids = [engine.start_workflow(doubler, i, queue="narrow-role") for i in range(5)]
            assert [engine.wait(r, timeout=30) for r in run_ids] == [0, 2, 4, 6, 8]
        assert {q.name for q in engine.list_queues()} >= {"narrow-role", "default"}
        assert engine.store.delete_finished_runs(engine.store.clock.now(), 10) == 5
    finally:
        adapter.close()


def test_a_role_without_the_schema_gets_a_clear_error(restricted_role: tuple[str, str]) -> None:
    dsn, _schema = restricted_role
    with pytest.raises(DatabasePermissionError, match="may not create schema 'not_granted_here'"):
        PostgresAdapter(dsn, schema="not_granted_here")
