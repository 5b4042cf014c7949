"""Transaction steps and transactional starts on a real PostgreSQL (docs/reference/contract.md §9): serialization
failures retried, the step's own connection lost mid-call, a second database, and runs and
events written through the application's transaction (committed, or rolled back), sync and
through the asyncio facade."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.domain.errors import SerializationError
from tests.pg import new_schema_name

pytestmark = pytest.mark.postgres

FAST = dex.RetryPolicy(initial_delay=timedelta(milliseconds=10), max_attempts=4, randomization_factor=0)
STATE: dict[str, Any] = {}


@dex.transaction(name="bump", retry=FAST, isolation="serializable")
def bump(conn: Any, amount: int) -> int:
    """Reads the balance, then (on its first attempt) lets another transaction change it before
    writing: SQLSTATE 40001 at the update, a failed attempt retried under the policy."""
    table = STATE["table"]
    STATE["attempts"] = STATE.get("attempts", 0) + 1
    (balance,) = conn.execute(f"SELECT balance FROM {table} WHERE id = 1").fetchone()
    if STATE["attempts"] == 1:
        with psycopg.connect(STATE["dsn"], autocommit=True) as other:
            other.execute(f"UPDATE {table} SET balance = balance + 1000 WHERE id = 1")
    conn.execute(f"UPDATE {table} SET balance = %s WHERE id = 1", [balance + amount])
    return int(balance + amount)


@dex.transaction(name="cut-off", retry=FAST)
def cut_off(conn: Any, note: str) -> str:
    """Inserts a row, then (first attempt) has its own session terminated: the store fails."""
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    STATE["attempts"] = STATE.get("attempts", 0) + 1
    if STATE["attempts"] == 1:
        pid = conn.info.backend_pid
        with psycopg.connect(STATE["dsn"], autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
    return note


@dex.transaction(name="skew", retry=FAST, isolation="serializable")
def skew(conn: Any, note: str) -> str:
    """Reads row 1 and writes row 2 while (first attempt) another serializable transaction reads
    row 2, writes row 1 and commits first: a write skew, SQLSTATE 40001 in the completion's
    statements or the commit (after the function returned)."""
    table = STATE["table"]
    STATE.setdefault("attempts_seen", []).append(dex.activity_context().attempt)
    conn.execute(f"SELECT balance FROM {table} WHERE id = 1").fetchone()
    conn.execute(f"UPDATE {table} SET balance = balance + 1, note = %s WHERE id = 2", [note])
    if len(STATE["attempts_seen"]) == 1:
        with psycopg.connect(STATE["dsn"]) as other:
            other.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            other.execute(f"SELECT balance FROM {table} WHERE id = 2").fetchone()
            other.execute(f"UPDATE {table} SET balance = balance + 100 WHERE id = 1")
    return note


@dex.workflow(name="skewer")
async def skewer(ctx: dex.WorkflowContext, note: str) -> str:
    result: str = await ctx.activity(skew, note)
    return result


@dex.workflow(name="bumper")
async def bumper(ctx: dex.WorkflowContext, amount: int) -> int:
    result: int = await ctx.activity(bump, amount)
    return result


@dex.workflow(name="cutter")
async def cutter(ctx: dex.WorkflowContext, note: str) -> str:
    result: str = await ctx.activity(cut_off, note)
    return result


@dex.workflow(name="awaits-payment")
async def awaits_payment(ctx: dex.WorkflowContext, order: str) -> str:
    paid = await ctx.wait_for_event("paid", timeout=timedelta(minutes=5))
    return f"{order}: {paid}"


@pytest.fixture
def table(pg_dsn: str, pg_schema: str) -> str:
    name = sql.Identifier(pg_schema, "app").as_string(None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(pg_schema).as_string(None)}")
        conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, balance int NOT NULL DEFAULT 0, note text)")
        conn.execute(f"INSERT INTO {name} (balance) VALUES (0), (0)")
    STATE.clear()
    STATE.update(dsn=pg_dsn, table=name)
    return name


def test_a_serialization_failure_is_retried_and_the_step_commits_once(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [bumper], [bump])
    run_id = engine.start_workflow(bumper, 5)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 1005  # attempt 2 read the other transaction's write
    assert STATE["attempts"] == 2
    with psycopg.connect(STATE["dsn"]) as conn:
        assert conn.execute(f"SELECT balance FROM {table} WHERE id = 1").fetchone() == (1005,)


def test_a_serialization_failure_after_the_function_is_the_steps_own_and_counts_as_an_attempt(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [skewer, cutter], [skew, cut_off])
    run_id = engine.start_workflow(skewer, "skewed")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "skewed"
    assert STATE["attempts_seen"] == [1, 2]  # the 40001 failed attempt 1 (a store failure would not count)
    with psycopg.connect(STATE["dsn"]) as conn:
        assert conn.execute(f"SELECT balance, note FROM {table} WHERE id = 2").fetchone() == (1, "skewed")
        assert conn.execute(f"SELECT balance FROM {table} WHERE id = 1").fetchone() == (100,)
    STATE["attempts"] = 1
    healthy = engine.start_workflow(cutter, "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "healthy"


def test_the_steps_connection_lost_mid_call_rolls_back_and_the_retry_commits_once(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [cutter, bumper], [cut_off, bump])
    run_id = engine.start_workflow(cutter, "once")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "once"
    with psycopg.connect(STATE["dsn"]) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE note = 'once'").fetchone() == (1,)
    STATE["attempts"] = 1  # a healthy run afterwards, on the same adapter (its pool replaced the connection)
    healthy = engine.start_workflow(cutter, "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "healthy"


def test_a_run_started_in_a_rolled_back_transaction_never_exists(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    with dex.Engine(make_adapter(), [awaits_payment], [], poll_interval=0.05) as engine:
        with psycopg.connect(STATE["dsn"]) as conn:
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} (note) VALUES ('order 1')")
                ghost = engine.start_workflow(awaits_payment, "order 1", connection=conn, instance_id="order-1")
                raise_rollback(conn)
        with pytest.raises(dex.RunNotFoundError):
            engine.get_run(ghost)
        with psycopg.connect(STATE["dsn"]) as conn:
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE note = 'order 1'").fetchone() == (0,)
        # the same instance id is free: nothing of the rolled-back start remains
        with psycopg.connect(STATE["dsn"]) as conn, conn.transaction():
            run_id = engine.start_workflow(awaits_payment, "order 1", connection=conn, instance_id="order-1")
            assert run_id != ghost
        with psycopg.connect(STATE["dsn"]) as conn:
            with conn.transaction():
                engine.send_event(run_id, "paid", "wrong", connection=conn)
                raise_rollback(conn)
            with conn.transaction():
                engine.send_event(run_id, "paid", 4200, connection=conn)
        assert engine.wait(run_id, timeout=10) == "order 1: 4200"  # the rolled-back event never arrived


GATE = threading.Event()


@dex.activity(name="gate")
def gate(x: int) -> int:
    GATE.wait(30)
    return x


@dex.activity(name="plus-one")
def plus_one(x: int) -> int:
    return x + 1


@dex.workflow(name="gated")
async def gated(ctx: dex.WorkflowContext, x: int) -> int:
    result: int = await ctx.activity(gate, x)
    return result


@dex.workflow(name="quick")
async def quick(ctx: dex.WorkflowContext, x: int) -> int:
    result: int = await ctx.activity(plus_one, x)
    return result


@pytest.mark.parametrize("ends", [False, True], ids=["still-running", "ended-before-the-commit"])
def test_an_open_transaction_that_sent_an_event_holds_no_write_of_the_engine_back(
    make_adapter: Callable[..., PostgresAdapter], table: str, ends: bool
) -> None:
    """``send_event(connection=...)`` in a transaction the application keeps open: the run's
    own next write, and every other run's, go on meanwhile (its lock was FOR SHARE, which the
    engine's completion waits for: the whole flush, every run in it, waited for the commit).
    A run that ends before the commit ends without the event, as without any unread one."""
    GATE.clear()
    with dex.Engine(make_adapter(), [gated, quick], [gate, plus_one], poll_interval=0.05) as engine:
        assert engine.wait(engine.start_workflow(quick, 0), timeout=10) == 1
        target = engine.start_workflow(gated, 7)
        deadline = time.monotonic() + 10
        while engine.get_run(target).status is not dex.RunStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.01)
        with psycopg.connect(STATE["dsn"]) as conn, conn.transaction():
            engine.send_event(target, "note", "from the open transaction", connection=conn)
            GATE.set()  # the target's activity ends: its outcome is written while the lock is held
            if ends:
                assert engine.wait(target, timeout=10) == 7
            other = engine.start_workflow(quick, 5)
            assert engine.wait(other, timeout=10) == 6  # not held back by the open transaction
        assert engine.wait(target, timeout=10) == 7
        assert engine.get_run(target).status is dex.RunStatus.COMPLETED
        healthy = engine.start_workflow(quick, 10)
        assert engine.wait(healthy, timeout=10) == 11


@dex.workflow(name="parent-of-shared")
async def parent_of_shared(ctx: dex.WorkflowContext, x: int) -> str:
    try:
        result: int = await ctx.child(quick, x, instance_id="shared-order")
    except dex.ChildWorkflowFailedError as exc:
        return f"clash: {exc.failure.message}"
    return f"child: {result}"


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "rolled-back"])
def test_a_start_in_an_open_transaction_holds_back_only_the_child_that_wants_its_instance_id(
    make_adapter: Callable[..., PostgresAdapter], table: str, commit: bool
) -> None:
    """A child whose instance id a start in the application's open transaction has taken waits
    for that transaction, alone: its insert used to wait inside the engine's completion, and
    the whole flush, every run in it and every flush behind it, waited for the commit."""
    with dex.Engine(
        make_adapter(), [awaits_payment, parent_of_shared, quick], [plus_one], poll_interval=0.05
    ) as engine:
        assert engine.wait(engine.start_workflow(quick, 0), timeout=10) == 1
        with psycopg.connect(STATE["dsn"]) as conn:
            with conn.transaction():
                mine = engine.start_workflow(awaits_payment, "order", instance_id="shared-order", connection=conn)
                parent = engine.start_workflow(parent_of_shared, 1)
                other = engine.start_workflow(quick, 5)
                assert engine.wait(other, timeout=10) == 6  # not held back by the open transaction
                time.sleep(0.3)  # the parent's first task has been tried meanwhile
                assert not engine.get_run(parent).status.is_terminal
                if not commit:
                    raise_rollback(conn)
        if commit:  # the application's run holds the instance id: the child clashes
            assert engine.wait(parent, timeout=20) == "clash: instance id 'shared-order' is in use by a running run"
            engine.send_event(mine, "paid", 1)
            assert engine.wait(mine, timeout=10) == "order: 1"
        else:  # nothing holds it: the child starts
            assert engine.wait(parent, timeout=20) == "child: 2"
            with pytest.raises(dex.RunNotFoundError):
                engine.get_run(mine)
        healthy = engine.start_workflow(quick, 10)
        assert engine.wait(healthy, timeout=10) == 11


def raise_rollback(conn: psycopg.Connection) -> None:
    """Leave the current ``conn.transaction()`` block by rolling it back."""
    raise psycopg.Rollback()


def test_the_asyncio_facade_writes_through_an_async_connection(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    with dex.Engine(make_adapter(), [awaits_payment], []) as engine:

        async def app() -> str:
            async with await psycopg.AsyncConnection.connect(STATE["dsn"]) as conn:
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {table} (note) VALUES ('async order')")
                    run_id = await engine.start_workflow_async(
                        awaits_payment, "async order", connection=conn, instance_id="async-order"
                    )
                async with conn.transaction():
                    await engine.send_event_async(run_id, "paid", 7, connection=conn)
                    raise psycopg.Rollback()
                async with conn.transaction():
                    await engine.send_event_async(run_id, "paid", 8, connection=conn)
                with pytest.raises(TypeError, match=r"connection must be a psycopg\.AsyncConnection"):
                    await engine.start_workflow_async(awaits_payment, "x", connection=object())
            return str(await engine.wait_async(run_id, timeout=10))

        assert asyncio.run(app()) == "async order: 8"


def test_bad_connections_are_refused_naming_the_parameter(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [awaits_payment], [])
    with pytest.raises(TypeError, match=r"connection must be a psycopg\.Connection"):
        engine.start_workflow(awaits_payment, "x", connection="postgresql://")
    with pytest.raises(TypeError, match=r"connection must be a psycopg\.Connection"):
        engine.send_event("r", "paid", connection=42)
    closed = psycopg.connect(STATE["dsn"])
    closed.close()
    with pytest.raises(ValueError, match="connection is closed"):
        engine.start_workflow(awaits_payment, "x", connection=closed)
    with psycopg.connect(STATE["dsn"]) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(ValueError, match="failed transaction"):
            engine.start_workflow(awaits_payment, "x", connection=conn)
        conn.rollback()
        with pytest.raises(dex.RunNotFoundError):
            engine.send_event("no-such-run", "paid", connection=conn)
    # a healthy start afterwards
    run_id = engine.start_workflow(awaits_payment, "fine")
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED


@dex.transaction(name="note-it")
async def note_it(conn: psycopg.AsyncConnection, note: str) -> int:
    cursor = await conn.execute("INSERT INTO app_notes (note) VALUES (%s) RETURNING id", [note])
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


@dex.workflow(name="noter")
async def noter(ctx: dex.WorkflowContext, note: str) -> int:
    result: int = await ctx.activity(note_it, note)
    return result


def test_a_separate_database_and_an_async_step(pg_dsn: str) -> None:
    """The engine on a database of its own (not the application's default one): the step's
    connection is that database's, and the step's table lives there."""
    name = new_schema_name("dex_tx")  # a database name no other test (nor test process) uses
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE app_notes (id serial PRIMARY KEY, note text)")
        adapter = PostgresAdapter(dsn, schema="engine")
        try:
            engine = dex.Engine(adapter, [noter], [note_it])
            run_id = engine.start_workflow(noter, "separate")
            engine.drain()
            assert engine.wait(run_id, timeout=10) == 1
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT note FROM app_notes").fetchall() == [("separate",)]
        finally:
            adapter.close()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dex.transaction(name="slow-insert", retry=FAST)
def slow_insert(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    STATE.setdefault("ran", []).append(note)
    threading.Event().wait(1.5)  # three times the activity lease: it expires while the row is locked
    return note


@dex.workflow(name="slow")
async def slow(ctx: dex.WorkflowContext, note: str) -> str:
    result: str = await ctx.activity(slow_insert, note)
    return result


def test_two_engines_racing_on_a_step_whose_lease_expires_mid_transaction_commit_once(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    from dex.app.ports.clock import SystemClock

    engines = [
        dex.Engine(make_adapter(clock=SystemClock()), [slow], [slow_insert], activity_lease=timedelta(seconds=0.5))
        for _ in range(2)
    ]
    for engine in engines:
        engine.start()
    try:
        run_ids = [engines[0].start_workflow(slow, f"race-{n}") for n in range(3)]
        assert [engines[1].wait(r, timeout=30) for r in run_ids] == [f"race-{n}" for n in range(3)]
    finally:
        for engine in engines:
            engine.stop(timeout=10)
    with psycopg.connect(STATE["dsn"]) as conn:
        rows = conn.execute(f"SELECT note FROM {table} WHERE note LIKE 'race-%%' ORDER BY note").fetchall()
    assert rows == [("race-0",), ("race-1",), ("race-2",)]
    assert sorted(STATE["ran"]) == ["race-0", "race-1", "race-2"]  # nobody took a locked step over


def test_poisoned_transactional_starts_and_events_fail_clearly_and_write_nothing(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [awaits_payment], [])
    with psycopg.connect(STATE["dsn"]) as conn:
        with conn.transaction():
            conn.execute(f"INSERT INTO {table} (note) VALUES ('kept')")
            with pytest.raises(ValueError, match="instance_id"):
                engine.start_workflow(awaits_payment, "x", instance_id="a\x00b", connection=conn)
            with pytest.raises(ValueError, match="instance_id"):
                engine.start_workflow(awaits_payment, "x", instance_id="s\ud800", connection=conn)
            with pytest.raises(SerializationError, match="not valid Unicode"):
                engine.start_workflow(awaits_payment, "half \udc00", connection=conn)
            run_id = engine.start_workflow(
                awaits_payment, "nul\x00order", connection=conn
            )  # a NUL in a payload is data
            for name in ("pa\x00id", "pa\ud800id"):
                with pytest.raises(ValueError, match="event"):
                    engine.send_event(run_id, name, 1, connection=conn)
            with pytest.raises(SerializationError, match="not valid Unicode"):
                engine.send_event(run_id, "paid", "\ud800", connection=conn)
            engine.send_event(run_id, "paid", "in full", connection=conn)  # the caller's transaction still works
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED
    with psycopg.connect(STATE["dsn"]) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE note = 'kept'").fetchone() == (1,)
    engine.drain()
    assert engine.wait(run_id, timeout=10) == "nul\x00order: in full"


def test_the_callers_connection_dropped_mid_start_is_its_error_and_the_next_start_works(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    engine = dex.Engine(make_adapter(), [awaits_payment], [])
    conn = psycopg.connect(STATE["dsn"])
    with psycopg.connect(STATE["dsn"], autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
    with pytest.raises(psycopg.OperationalError):
        engine.start_workflow(awaits_payment, "lost", instance_id="lost", connection=conn)
    conn.close()
    # nothing of the lost start exists: the same instance id starts a new run (else its id came back)
    with psycopg.connect(STATE["dsn"]) as fresh, fresh.transaction():
        run_id = engine.start_workflow(awaits_payment, "found", instance_id="lost", connection=fresh)
    engine.send_event(run_id, "paid", 3)
    engine.drain()
    assert engine.wait(run_id, timeout=10) == "found: 3"  # not "lost: 3"
