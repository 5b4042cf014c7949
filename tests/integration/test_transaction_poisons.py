"""What a transaction step's function does to its *transaction* and to the *connection object*
stays with its step, on a real PostgreSQL:

* an attribute it sets on the connection (``conn.row_factory = dict_row``) serves its own
  queries and is set back before dex's statements run on the connection (before the fix, dex's
  completion read dicts for tuples: the store's failure, the attempt given back again and again);
* an error that dex's own statements meet after the function ran, because of what the function
  did to the transaction (``SET LOCAL transaction_read_only``, a deferred constraint its writes
  break at the commit), is the step's failure, counted under its retry policy (before: the
  store's failure, the same attempt run again without end).

Each poisoned run gets its error, and healthy runs complete afterwards, for ``def`` and
``async def`` steps alike."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.app.ports.clock import SystemClock

pytestmark = pytest.mark.postgres

TWICE = dex.RetryPolicy(initial_delay=timedelta(milliseconds=10), max_attempts=2, randomization_factor=0)
STATE: dict[str, Any] = {}


@dex.transaction(name="dict-rows", retry=TWICE)
def dict_rows(conn: Any, note: str) -> str:
    conn.row_factory = dict_row
    row = conn.execute("SELECT %s::text AS note", [note]).fetchone()
    return str(row["note"])  # the function's own queries read dicts, as it asked


@dex.transaction(name="dict-rows-async", retry=TWICE)
async def dict_rows_async(conn: Any, note: str) -> str:
    conn.row_factory = dict_row
    row = await (await conn.execute("SELECT %s::text AS note", [note])).fetchone()
    return str(row["note"])


@dex.transaction(name="read-only", retry=TWICE)
def read_only(conn: Any, note: str) -> str:
    conn.execute("SET LOCAL transaction_read_only = on")
    return note


@dex.transaction(name="read-only-async", retry=TWICE)
async def read_only_async(conn: Any, note: str) -> str:
    await conn.execute("SET LOCAL transaction_read_only = on")
    return note


@dex.transaction(name="breaks-a-deferred-constraint", retry=TWICE)
def breaks_a_deferred_constraint(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s), (%s)", [note, note])  # checked at COMMIT
    return note


@dex.transaction(name="breaks-a-deferred-constraint-async", retry=TWICE)
async def breaks_a_deferred_constraint_async(conn: Any, note: str) -> str:
    await conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s), (%s)", [note, note])
    return note


@dex.transaction(name="writes", retry=TWICE)
def writes(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    return note


@dex.transaction(name="ends-its-transaction", retry=TWICE)
def ends_its_transaction(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    how, via = note.split("-")[:2]  # COMMIT or ROLLBACK as SQL (conn.commit() is refused), sent how
    if via == "libpq":  # past psycopg: only the store, after the function, can see it
        conn.pgconn.exec_(how.encode())
    else:
        (conn.cursor() if via == "cursor" else conn).execute(f"SELECT 1; {how}" if via == "multi" else how)
    return note


@dex.transaction(name="ends-its-transaction-async", retry=TWICE)
async def ends_its_transaction_async(conn: Any, note: str) -> str:
    await conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    how, via = note.split("-")[:2]
    if via == "libpq":
        conn.pgconn.exec_(how.encode())
    else:
        await (conn.cursor() if via == "cursor" else conn).execute(f"SELECT 1; {how}" if via == "multi" else how)
    return note


@dex.workflow(name="one-step")
async def one_step(ctx: dex.WorkflowContext, step: str, note: str) -> str:
    result: str = await ctx.activity(step, note)
    return result


STEPS = [
    dict_rows,
    dict_rows_async,
    read_only,
    read_only_async,
    breaks_a_deferred_constraint,
    breaks_a_deferred_constraint_async,
    ends_its_transaction,
    ends_its_transaction_async,
    writes,
]


@pytest.fixture
def table(pg_dsn: str, pg_schema: str) -> str:
    name = sql.Identifier(pg_schema, "notes").as_string(None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(pg_schema).as_string(None)}")
        conn.execute(f"CREATE TABLE {name} (note text UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    STATE.clear()
    STATE.update(table=name)
    return name


def _healthy(engine: dex.Engine, table: str, pg_dsn: str) -> None:
    run_ids = [engine.start_workflow(one_step, "writes", f"healthy-{i}") for i in range(10)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [f"healthy-{i}" for i in range(10)]
    with psycopg.connect(pg_dsn) as conn:
        notes = {row[0] for row in conn.execute(f"SELECT note FROM {table}")}
    assert {f"healthy-{i}" for i in range(10)} <= notes


@pytest.mark.parametrize("step", ["dict-rows", "dict-rows-async"])
def test_an_attribute_the_function_sets_on_its_connection_serves_it_and_is_set_back(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, table: str, step: str
) -> None:
    adapter = make_adapter(max_connections=8, clock=SystemClock())
    engine = dex.Engine(adapter, [one_step], STEPS)
    engine.start()
    try:
        assert engine.wait(engine.start_workflow(one_step, step, "as dicts"), timeout=30) == "as dicts"
        _healthy(engine, table, pg_dsn)
        adapter._kept.release()  # every pooled connection, the kept one too, reads tuples again
        taken = [adapter._pool.getconn(timeout=10) for _ in range(8)]
        try:
            assert all(conn.row_factory is tuple_row for conn in taken)
        finally:
            for conn in taken:
                adapter._pool.putconn(conn)
    finally:
        engine.stop(timeout=10)


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ("read-only", "ReadOnlySqlTransaction"),
        ("read-only-async", "ReadOnlySqlTransaction"),
        ("breaks-a-deferred-constraint", "UniqueViolation"),
        ("breaks-a-deferred-constraint-async", "UniqueViolation"),
    ],
)
def test_an_error_the_function_causes_in_dex_statements_is_the_steps_failure(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, table: str, step: str, error: str
) -> None:
    engine = dex.Engine(make_adapter(clock=SystemClock()), [one_step], STEPS)  # retries come due
    engine.start()
    try:
        run_id = engine.start_workflow(one_step, step, "poisoned")
        with pytest.raises(dex.WorkflowFailedError) as failed:
            engine.wait(run_id, timeout=30)  # two counted attempts, not the same one again and again
        assert error in str(failed.value.failure), failed.value.failure
        assert engine.get_run(run_id).status is dex.RunStatus.FAILED
        _healthy(engine, table, pg_dsn)
    finally:
        engine.stop(timeout=10)
    with psycopg.connect(pg_dsn) as conn:  # nothing of the failed attempts stayed
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE note = 'poisoned'").fetchone() == (0,)


@pytest.mark.parametrize("step", ["ends-its-transaction", "ends-its-transaction-async"])
@pytest.mark.parametrize("how", ["COMMIT", "ROLLBACK"])
@pytest.mark.parametrize("via", ["execute", "cursor", "multi", "libpq"])
def test_a_function_that_ends_its_transaction_with_sql_fails_its_step_and_nothing_is_recorded_twice(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, table: str, step: str, how: str, via: str
) -> None:
    adapter = make_adapter(clock=SystemClock())
    grouped: set[str] = set()  # the steps that ran in a group
    real = adapter.checkpoint_steps

    def counted(items: Any, now: Any) -> Any:
        grouped.update(item.step.name for item in items)
        return real(items, now)

    adapter.checkpoint_steps = counted  # type: ignore[method-assign]
    engine = dex.Engine(adapter, [one_step], STEPS, inline_activity_seconds=0.5)  # quick steps may group
    engine.start()
    notes = [f"{how}-{via}-first", f"{how}-{via}-second"]  # as a task of its own; then (a def) in a group
    try:
        for note in notes:
            run_id = engine.start_workflow(one_step, step, note)
            with pytest.raises(dex.WorkflowFailedError) as failed:
                engine.wait(run_id, timeout=30)
            message = str(failed.value.failure)
            # refused before it is sent, through the connection or one of its cursors, behind
            # another statement of the same text too; or, sent past psycopg, found once the
            # function returned
            expected = {
                "execute": "called conn.execute",
                "cursor": "called conn.cursor.execute",
                "multi": "called conn.execute",
                "libpq": "ended the step's transaction itself",
            }[via]
            assert expected in message and step in message, message
        _healthy(engine, table, pg_dsn)
    finally:
        engine.stop(timeout=10)
    assert (step in grouped) is (step == "ends-its-transaction")  # async def steps never run in groups
    with psycopg.connect(pg_dsn) as conn:
        rows = [
            row[0] for row in conn.execute(f"SELECT note FROM {table} WHERE note LIKE %s ORDER BY note", [how + "%"])
        ]
    # what a function committed itself stays, once (a terminal failure is not retried); a refused
    # COMMIT and a ROLLBACK leave nothing, and the run is not recorded as if the step had written
    assert rows == (sorted(notes) if (how, via) == ("COMMIT", "libpq") else [])
