"""Keyed starts racing on PostgreSQL (docs/reference/contract.md §15): starts of one instance id under
``id_reuse="never"``/``"failed_only"`` from several engines at once, also while runs of that id
end, and from the application's transactions (``connection=``), make one run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.testing import VirtualClock

pytestmark = pytest.mark.postgres


@dex.workflow(name="quick")
async def quick(ctx: dex.WorkflowContext, value: str) -> str:
    if value == "fail":
        raise RuntimeError("asked to fail")
    return value


def _race(starts: list[Callable[[], str]]) -> list[str]:
    """Run the starts at once (each on its own thread, released together)."""
    barrier = threading.Barrier(len(starts))

    def go(start: Callable[[], str]) -> str:
        barrier.wait()
        return start()

    with ThreadPoolExecutor(len(starts)) as pool:
        return list(pool.map(go, starts))


def test_engines_racing_under_never_make_one_run(make_adapter: Callable[..., PostgresAdapter]) -> None:
    engines = [dex.Engine(make_adapter(max_connections=2), [quick]) for _ in range(6)]
    for key in ("k1", "k2", "k3"):
        got = _race(
            [lambda e=e, key=key: e.start_workflow(quick, "a", instance_id=key, id_reuse="never") for e in engines]
        )
        assert len(set(got)) == 1
        assert [r.run_id for r in engines[0].list_runs(instance_id=key)] == got[:1]


def test_engines_racing_after_a_failure_under_failed_only_make_one_new_run(
    make_adapter: Callable[..., PostgresAdapter],
) -> None:
    engines = [dex.Engine(make_adapter(max_connections=2), [quick]) for _ in range(6)]
    failed = engines[0].start_workflow(quick, "fail", instance_id="k")
    engines[0].drain()
    assert engines[0].get_run(failed).status is dex.RunStatus.FAILED
    got = _race([lambda e=e: e.start_workflow(quick, "b", instance_id="k", id_reuse="failed_only") for e in engines])
    assert len(set(got)) == 1 and got[0] != failed
    assert len(engines[0].list_runs(instance_id="k")) == 2


def test_never_makes_one_run_while_the_runs_end_as_fast_as_they_can(
    make_adapter: Callable[..., PostgresAdapter],
) -> None:
    """Started engines end each run within milliseconds of its start, so a start that read no run
    and then inserted would, without the instance id's lock, find the live-run index free again
    (the first run ended in between) and make a second run."""
    from dex.app.ports.clock import SystemClock

    engines = [
        dex.Engine(make_adapter(max_connections=4, clock=SystemClock()), [quick], poll_interval=0.01) for _ in range(4)
    ]
    for engine in engines:
        engine.start()
    try:
        keys = [f"burst-{n}" for n in range(25)]

        def starts_of(engine: dex.Engine) -> Callable[[], str]:
            def start() -> str:
                for key in keys:
                    engine.start_workflow(quick, key, instance_id=key, id_reuse="never")
                    time.sleep(0.001)
                return "done"

            return start

        _race([starts_of(e) for e in engines])
        for key in keys:
            runs = engines[0].list_runs(instance_id=key)
            assert len(runs) == 1, (key, runs)
            assert engines[0].wait(runs[0].run_id, timeout=20) == key
    finally:
        for engine in engines:
            engine.stop(timeout=5)


def test_transactions_racing_under_never_make_one_run(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str
) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    inside = threading.Event()

    def in_transaction(hold: float) -> str:
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            run_id = engine.start_workflow(quick, "a", instance_id="tx-key", id_reuse="never", connection=conn)
            inside.set()
            time.sleep(hold)  # the other start waits for this commit, then finds the run
            return run_id

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(in_transaction, 0.3)
        assert inside.wait(5)
        second = pool.submit(in_transaction, 0)
        assert first.result(10) == second.result(10)
    assert len(engine.list_runs(instance_id="tx-key")) == 1


def test_a_rolled_back_keyed_start_leaves_nothing_and_a_later_one_works(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str
) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():  # psycopg.Rollback ends it, rolled back, without an error
            ghost = engine.start_workflow(quick, "a", instance_id="k", id_reuse="never", connection=conn)
            raise psycopg.Rollback()
    with pytest.raises(dex.RunNotFoundError):
        engine.get_run(ghost)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        run_id = engine.start_workflow(quick, "b", instance_id="k", id_reuse="never", connection=conn)
    engine.drain()
    assert engine.wait(run_id) == "b"


def test_a_debounced_start_in_a_transaction_moves_the_start_on_commit(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, clock: VirtualClock
) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    t0 = clock.now()
    run_id = engine.start_workflow(quick, "a", instance_id="k", debounce=timedelta(seconds=10))
    clock.advance(timedelta(seconds=5))
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        assert (
            engine.start_workflow(quick, "b", instance_id="k", debounce=timedelta(seconds=10), connection=conn)
            == run_id
        )
    engine.drain()
    assert engine.wait(run_id) == "b"
    assert engine.get_run(run_id).started_at == t0 + timedelta(seconds=15)


def test_a_keyed_start_on_a_failed_transaction_is_refused_and_the_next_works(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str
) -> None:
    """The store failing mid-start (the caller's transaction is aborted): the error reaches the
    caller, nothing is made, and a healthy start afterwards completes."""
    engine = dex.Engine(make_adapter(), [quick])
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(ValueError, match="in a failed transaction"), conn.transaction():
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
            engine.start_workflow(quick, "a", instance_id="k", id_reuse="never", connection=conn)
    assert engine.list_runs(instance_id="k") == []
    run_id = engine.start_workflow(quick, "b", instance_id="k", id_reuse="never")
    engine.drain()
    assert engine.wait(run_id) == "b"


def test_a_keyed_start_takes_the_adapters_refusals_of_bad_text(make_adapter: Callable[..., PostgresAdapter]) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    with pytest.raises((ValueError, TypeError)):
        engine.start_workflow(quick, "a", instance_id="k", id_reuse="never", labels={"a\x00": "b"})
    assert engine.list_runs() == []
    run_id = engine.start_workflow(quick, "ok", instance_id="k", id_reuse="never", labels={"a": "b"})
    engine.drain()
    assert engine.wait(run_id) == "ok"


def test_a_run_that_ends_between_a_starts_lookup_and_its_insert_is_still_the_answer(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, pg_schema: str
) -> None:
    """The window the instance id's lock closes, widened by a trigger that holds the insert of
    the start labelled ``slow`` for a second: that start has read "no run"; meanwhile another
    start of the id makes a run and the run ends, so the live-run index no longer stands in the
    way. Without the lock the slow start would make a second run; with it, the other start waits
    for the slow one's commit and both answer with its run."""
    engine = dex.Engine(make_adapter(), [quick])  # makes the schema
    s = sql.Identifier(pg_schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.slow_insert() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN IF NEW.labels ? 'slow' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$"
            ).format(s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER slow BEFORE INSERT ON {}.runs FOR EACH ROW EXECUTE FUNCTION {}.slow_insert()"
            ).format(s, s)
        )
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            lambda: engine.start_workflow(quick, "slow", instance_id="k", id_reuse="never", labels={"slow": "1"})
        )
        time.sleep(0.3)  # the slow start has looked and is inside its insert
        fast = engine.start_workflow(quick, "fast", instance_id="k", id_reuse="never")
        engine.drain()  # ends whatever run there is
        assert slow.result(10) == fast
    engine.drain()
    assert [r.run_id for r in engine.list_runs(instance_id="k")] == [fast]
    assert engine.wait(fast) == "slow"


def _failing_trigger(pg_dsn: str, schema: str, table: str, when: str) -> None:
    """Make the store fail mid-start: a trigger that raises on ``when`` of ``table``'s rows."""
    s = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.fail_now() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN RAISE EXCEPTION 'the store failed here'; END $$"
            ).format(s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER fail_now BEFORE " + when + " ON {}.{} FOR EACH ROW EXECUTE FUNCTION {}.fail_now()"
            ).format(s, sql.Identifier(table), s)
        )


def _drop_failing_trigger(pg_dsn: str, schema: str, table: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TRIGGER fail_now ON {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))


def test_the_store_failing_after_the_lookup_leaves_nothing_and_the_next_start_works(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, pg_schema: str
) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    _failing_trigger(pg_dsn, pg_schema, "inbox", "INSERT")  # the run's row is in, its RunStarted fails
    with pytest.raises(psycopg.Error, match="the store failed here"):
        engine.start_workflow(quick, "a", instance_id="k", id_reuse="never")
    _drop_failing_trigger(pg_dsn, pg_schema, "inbox")
    assert engine.list_runs() == []  # the run's row went with the failed transaction
    run_id = engine.start_workflow(quick, "b", instance_id="k", id_reuse="never")
    engine.drain()
    assert engine.wait(run_id) == "b"


def test_the_store_failing_mid_debounce_leaves_the_waiting_run_as_it_was(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, pg_schema: str, clock: VirtualClock
) -> None:
    engine = dex.Engine(make_adapter(), [quick])
    t0 = clock.now()
    run_id = engine.start_workflow(quick, "a", instance_id="k", debounce=timedelta(seconds=10))
    clock.advance(timedelta(seconds=5))
    _failing_trigger(pg_dsn, pg_schema, "inbox", "UPDATE")  # the history is rewritten, the start's move fails
    with pytest.raises(psycopg.Error, match="the store failed here"):
        engine.start_workflow(quick, "b", instance_id="k", debounce=timedelta(seconds=10))
    _drop_failing_trigger(pg_dsn, pg_schema, "inbox")
    engine.drain()
    assert engine.wait(run_id) == "a"  # its arguments and its start time, both as they were
    assert engine.get_run(run_id).started_at == t0 + timedelta(seconds=10)


def test_the_asyncio_facade_makes_keyed_starts_in_an_async_transaction(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str
) -> None:
    import asyncio

    engine = dex.Engine(make_adapter(), [quick])
    first = engine.start_workflow(quick, "a", instance_id="k")
    engine.drain()

    async def app() -> str:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn, conn.transaction():
            return await engine.start_workflow_async(quick, "b", instance_id="k", id_reuse="never", connection=conn)

    assert asyncio.run(app()) == first
    assert len(engine.list_runs(instance_id="k")) == 1


def test_engines_triggering_a_schedule_under_never_at_once_make_one_run(
    make_adapter: Callable[..., PostgresAdapter],
) -> None:
    nightly = dex.Schedule("nightly", quick, cron="0 3 * * *", args=("night",), id_reuse="never")
    engines = [dex.Engine(make_adapter(max_connections=2), [quick], schedules=[nightly]) for _ in range(4)]
    for engine in engines:
        engine.drain(advance_time=False)  # stores the declared schedule
    got = _race([lambda e=e: e.trigger_schedule("nightly") for e in engines])
    assert len(set(got)) == 1
    engines[0].drain(advance_time=False)
    assert engines[0].wait(got[0]) == "night"
    # the same second again, the run ended: never keeps answering with it
    assert engines[1].trigger_schedule("nightly") == got[0]
    assert len(engines[0].list_runs(labels={"dex.schedule": "nightly"})) == 1
