"""How the adapter's connections behave when things go wrong: a wrong database, a stuck
statement, a stalled transaction, connections the server closed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from psycopg import conninfo, sql

import dex
from dex.adapters.postgres import DatabaseConnectionError, PostgresAdapter
from dex.adapters.postgres.connection import KeptConnection, open_pool
from tests.integration import workload
from tests.pg import dedicated_server

pytestmark = pytest.mark.postgres


@pytest.fixture
def app_dsn(pg_dsn: str) -> str:
    """The session's DSN with an application name of this test's own, to find its sessions by."""
    return conninfo.make_conninfo(pg_dsn, application_name=f"dex-test-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def adapters(app_dsn: str, pg_schema: str) -> Iterator[list[PostgresAdapter]]:
    made: list[PostgresAdapter] = []
    yield made
    for adapter in made:
        adapter.close()


def _sessions(dsn: str, application_name: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()",
            [application_name],
        ).fetchall()
    return [(pid, state) for pid, state in rows]


def _terminate_sessions(dsn: str, application_name: str) -> int:
    """End the sessions of ``application_name`` (but this one), as a server restart does; how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            [application_name],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_database_that_does_not_exist_fails_at_once_and_clearly(pg_dsn: str) -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseConnectionError, match="no_such_db") as caught:
        PostgresAdapter(conninfo.make_conninfo(pg_dsn, dbname="no_such_db"))
    assert time.monotonic() - started < 3
    assert "does not exist" in str(caught.value)


def test_pooled_sessions_carry_time_limits_and_custom_plans(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapters.append(PostgresAdapter(app_dsn, schema=pg_schema))
    with adapters[0].reading() as conn, conn.transaction():
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN"
                " ('statement_timeout', 'idle_in_transaction_session_timeout', 'plan_cache_mode', 'TimeZone')"
            ).fetchall()
        )
    assert settings == {
        "statement_timeout": "30000",
        "idle_in_transaction_session_timeout": "60000",
        "plan_cache_mode": "force_custom_plan",
        "TimeZone": "UTC",
    }


def test_a_statement_stuck_on_a_lock_is_cancelled_after_the_statement_timeout(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapter = PostgresAdapter(app_dsn, schema=pg_schema, statement_timeout=timedelta(milliseconds=500))
    adapters.append(adapter)
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
    run_id = engine.start_workflow(workload.pipeline, 1, 0.0, "step")
    with psycopg.connect(app_dsn) as holder:  # another session holds the run's row
        holder.execute(
            sql.SQL("SELECT 1 FROM {}.runs WHERE run_id = %s FOR UPDATE").format(sql.Identifier(pg_schema)), [run_id]
        )
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            engine.cancel(run_id)
        assert time.monotonic() - started < 5
    engine.cancel(run_id)  # the lock is gone, and the pool's connection still works
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED  # cancel requested, not yet processed


def test_a_session_stalled_inside_a_transaction_is_ended_and_its_locks_released(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapter = PostgresAdapter(app_dsn, schema=pg_schema, idle_in_transaction_timeout=timedelta(milliseconds=500))
    adapters.append(adapter)
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
    run_id = engine.start_workflow(workload.pipeline, 1, 0.0, "step")
    stalled = threading.Event()
    failure: list[BaseException] = []

    def stall() -> None:  # a process that locks a run, then hangs (a stopped VM, a debugger)
        try:
            with adapter.reading() as conn, conn.transaction():
                conn.execute(
                    sql.SQL("SELECT 1 FROM {}.runs WHERE run_id = %s FOR UPDATE").format(sql.Identifier(pg_schema)),
                    [run_id],
                )
                stalled.set()
                time.sleep(2)
                conn.execute("SELECT 1")
        except psycopg.Error as exc:  # IdleInTransactionSessionTimeout, or the closed connection
            failure.append(exc)

    thread = threading.Thread(target=stall)
    thread.start()
    assert stalled.wait(5)
    started = time.monotonic()
    other = PostgresAdapter(app_dsn, schema=pg_schema)
    adapters.append(other)
    dex.Engine(other, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES).cancel(run_id)
    assert time.monotonic() - started < 1.8  # the lock went with the stalled session, before it woke
    thread.join()
    assert failure, "the stalled session should have been closed by the server"


def test_connections_the_server_closed_are_replaced_without_errors(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapter = PostgresAdapter(app_dsn, schema=pg_schema, min_connections=4)
    adapters.append(adapter)
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
    name = conninfo.conninfo_to_dict(app_dsn)["application_name"]
    deadline = time.monotonic() + 5
    while len(_sessions(app_dsn, str(name))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    # what a server restart (or an administrator) does to idle connections
    assert _terminate_sessions(app_dsn, str(name)) >= 4
    time.sleep(0.2)
    # every pooled connection is dead; each call gets a live one at once, none fails
    started = time.monotonic()
    run_ids = [engine.start_workflow(workload.pipeline, n, 0.0, "step") for n in range(8)]
    assert [engine.get_run(run_id).status for run_id in run_ids] == [dex.RunStatus.CREATED] * 8
    assert time.monotonic() - started < 2  # not a pause per dead connection (1 s, 2 s, 4 s, ...)


def test_the_connection_kept_for_starts_is_replaced_when_the_server_closed_it(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapter = PostgresAdapter(app_dsn, schema=pg_schema)
    adapters.append(adapter)
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
    first = engine.start_workflow(workload.pipeline, 1, 0.0, "step")  # keeps a session for starts
    name = conninfo.conninfo_to_dict(app_dsn)["application_name"]
    assert _terminate_sessions(app_dsn, str(name)) >= 1
    time.sleep(0.2)
    # the kept session is dead: the next start notices, takes a live one, and does not fail
    second = engine.start_workflow(workload.pipeline, 2, 0.0, "step")
    assert [engine.get_run(r).status for r in (first, second)] == [dex.RunStatus.CREATED] * 2
    # and the kept session is one of the pool's: closing the adapter leaves none open
    adapter.close()
    # the pool may be opening a replacement for a killed session when it is closed: that one
    # is closed as soon as its connect returns, which on a loaded machine takes a while
    deadline = time.monotonic() + 15
    while _sessions(app_dsn, str(name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sessions(app_dsn, str(name)) == []


def test_starts_from_many_threads_share_the_kept_connection_and_the_pool(
    app_dsn: str, pg_schema: str, adapters: list[PostgresAdapter]
) -> None:
    adapter = PostgresAdapter(app_dsn, schema=pg_schema, max_connections=4)
    adapters.append(adapter)
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
    with ThreadPoolExecutor(max_workers=8) as pool:
        run_ids = list(pool.map(lambda n: engine.start_workflow(workload.pipeline, n, 0.0, "step"), range(200)))
    assert len(set(run_ids)) == 200
    assert {run.status for run in engine.list_runs(limit=500)} == {dex.RunStatus.CREATED}
    assert len(engine.list_runs(limit=500)) == 200


def test_calls_while_the_server_is_down_fail_clearly_and_work_again_once_it_is_back() -> None:
    pytest.importorskip("pgserver")
    with dedicated_server() as server:
        adapter = PostgresAdapter(server.dsn, pool_timeout=1)
        try:
            engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES)
            run_id = engine.start_workflow(workload.pipeline, 1, 0.0, "step")
            server.stop()
            started = time.monotonic()
            with pytest.raises(DatabaseConnectionError, match="no connection to PostgreSQL") as caught:
                engine.get_run(run_id)
            assert time.monotonic() - started < 5
            assert isinstance(caught.value, dex.DexError)
            server.start()
            # the pool reconnects in the background, pausing 1 s, 2 s, 4 s... between attempts
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert engine.get_run(run_id).status is dex.RunStatus.CREATED
                    break
                except DatabaseConnectionError:
                    assert time.monotonic() < deadline, "the adapter did not reconnect"
        finally:
            adapter.close()


def test_the_kept_connection_goes_back_to_the_pool_after_a_while(pg_dsn: str) -> None:
    """So that the pool's upkeep (its ``max_lifetime``) reaches it; until then it is reused."""
    now = [0.0]
    pool = open_pool(pg_dsn, min_size=1, max_size=2, timeout=10, name="dex-test-kept")
    try:
        kept = KeptConnection(pool, keep_for=60, clock=lambda: now[0])
        with kept.connection() as first:
            pass
        now[0] = 59
        with kept.connection() as again:
            assert again is first
        requests = pool.get_stats()["requests_num"]
        now[0] = 121  # more than keep_for since it was taken: back to the pool, and one taken anew
        with kept.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.get_stats()["requests_num"] == requests + 1
        kept.release()
        assert pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"]
    finally:
        pool.close()
