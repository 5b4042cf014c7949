"""A transaction step's connection on PostgreSQL is a real psycopg connection
(``dex.adapters.postgres.step_connections``):

* ``isinstance(conn, psycopg.Connection)`` holds in a ``def`` step, ``psycopg.AsyncConnection``
  in an ``async def`` one (before, the step got a proxy that was neither);
* so ``engine.start_workflow(..., connection=conn)`` from inside a step starts a run in the
  step's own transaction: it exists once the step commits and never if the step rolls back
  (before, it raised TypeError, and the step was retried until it gave up);
* ending the transaction is refused while the step holds the connection, through the connection
  and its cursors, and what the step set on the connection is set back after it, its adapters
  included; none of psycopg's private attributes is replaced for it.

Each engine test also completes a healthy run afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.adapt import Dumper
from psycopg.rows import dict_row, tuple_row

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.step_connections import (
    StepAsyncConnection,
    StepAsyncCursor,
    StepConnection,
    StepCursor,
    run_held,
    run_held_async,
)
from dex.app.ports.clock import SystemClock
from dex.app.ports.store import StepFailed
from dex.domain.values import TerminalError

pytestmark = pytest.mark.postgres

ONCE = dex.RetryPolicy(max_attempts=1)
STATE: dict[str, Any] = {}


@dex.workflow(name="started-by-a-step")
async def started(ctx: dex.WorkflowContext, note: str) -> str:
    return f"started: {note}"


@dex.transaction(name="kinds")
def kinds(conn: Any) -> list[Any]:
    return [isinstance(conn, psycopg.Connection), conn.info.transaction_status == pq.TransactionStatus.INTRANS]


@dex.transaction(name="kinds-async")
async def kinds_async(conn: Any) -> list[Any]:
    return [isinstance(conn, psycopg.AsyncConnection), conn.info.transaction_status == pq.TransactionStatus.INTRANS]


@dex.transaction(name="starts-a-run", retry=ONCE)
def starts_a_run(conn: Any, note: str, fail: bool) -> str:
    engine: dex.Engine = STATE["engine"]
    run_id = engine.start_workflow(started, note, connection=conn)
    STATE.setdefault("started", []).append(run_id)
    if fail:
        raise dex.TerminalError(f"{note}: rolled back with the run it started")
    return run_id


@dex.transaction(name="starts-a-run-async", retry=ONCE)
async def starts_a_run_async(conn: Any, note: str, fail: bool) -> str:
    engine: dex.Engine = STATE["engine"]
    run_id = await engine.start_workflow_async(started, note, connection=conn)
    STATE.setdefault("started", []).append(run_id)
    if fail:
        raise dex.TerminalError(f"{note}: rolled back with the run it started")
    return run_id


@dex.workflow(name="waits-for-paid")
async def waits(ctx: dex.WorkflowContext) -> Any:
    return await ctx.wait_for_event("paid")


@dex.transaction(name="sends-an-event", retry=ONCE)
def sends_an_event(conn: Any, run_id: str, amount: int, fail: bool) -> int:
    engine: dex.Engine = STATE["engine"]
    engine.send_event(run_id, "paid", amount, connection=conn)
    if fail:
        raise dex.TerminalError("rolled back with the event it sent")
    return amount


@dex.workflow(name="one-transaction-step")
async def one_step(ctx: dex.WorkflowContext, step: str, *args: Any) -> Any:
    return await ctx.activity(step, *args)


STEPS = [kinds, kinds_async, starts_a_run, starts_a_run_async, sends_an_event]


@pytest.fixture
def engine(make_adapter: Callable[..., PostgresAdapter]) -> Iterator[dex.Engine]:
    STATE.clear()
    engine = dex.Engine(make_adapter(clock=SystemClock()), [one_step, started, waits], STEPS)
    STATE["engine"] = engine
    engine.start()
    try:
        yield engine
    finally:
        engine.stop(timeout=10)


def _healthy(engine: dex.Engine) -> None:
    assert engine.wait(engine.start_workflow(one_step, "kinds"), timeout=30) == [True, True]


@pytest.mark.parametrize("step", ["kinds", "kinds-async"])
def test_the_step_gets_a_real_psycopg_connection_in_its_transaction(engine: dex.Engine, step: str) -> None:
    assert engine.wait(engine.start_workflow(one_step, step), timeout=30) == [True, True]


@pytest.mark.parametrize("step", ["starts-a-run", "starts-a-run-async"])
def test_a_run_started_with_the_steps_connection_commits_with_the_step(engine: dex.Engine, step: str) -> None:
    run_id = engine.start_workflow(one_step, step, "committed", False)
    child = engine.wait(run_id, timeout=30)
    assert STATE["started"] == [child]  # one attempt, one start
    assert engine.wait(child, timeout=30) == "started: committed"
    _healthy(engine)


@pytest.mark.parametrize("step", ["starts-a-run", "starts-a-run-async"])
def test_a_run_started_with_the_steps_connection_is_rolled_back_with_it(engine: dex.Engine, step: str) -> None:
    run_id = engine.start_workflow(one_step, step, "rolled back", True)
    with pytest.raises(dex.WorkflowFailedError, match="rolled back with the run it started"):
        engine.wait(run_id, timeout=30)
    (child,) = STATE["started"]
    with pytest.raises(dex.RunNotFoundError):
        engine.get_run(child)
    assert [run.run_id for run in engine.list_runs(workflow_name="started-by-a-step")] == []
    _healthy(engine)


def test_an_event_sent_with_the_steps_connection_commits_and_rolls_back_with_the_step(engine: dex.Engine) -> None:
    waiting = engine.start_workflow(waits)
    failed = engine.start_workflow(one_step, "sends-an-event", waiting, 1, True)
    with pytest.raises(dex.WorkflowFailedError, match="rolled back with the event it sent"):
        engine.wait(failed, timeout=30)
    assert [type(e.event).__name__ for e in engine.history(waiting) if "Event" in type(e.event).__name__] == []
    sent = engine.start_workflow(one_step, "sends-an-event", waiting, 4200, False)
    assert engine.wait(sent, timeout=30) == 4200
    assert engine.wait(waiting, timeout=30) == 4200  # the one event that committed, not the rolled-back one
    _healthy(engine)


class _Refusing(Dumper):
    def dump(self, obj: Any) -> bytes:
        raise RuntimeError("this dumper refuses every str")


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[StepConnection]:
    conn = StepConnection.connect(pg_dsn, cursor_factory=StepCursor)
    try:
        yield conn
    finally:
        conn.close()


def _held(conn: StepConnection, work: Callable[[Any], Any]) -> Any:
    """``work`` held as a step's, inside a transaction (as the store runs it); its failure's cause."""
    try:
        with conn.transaction():
            conn.execute("SELECT 1")
            return run_held(conn, "the-step", work)
    except StepFailed as failed:
        return failed.cause


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (lambda c: c.commit(), "conn.commit()"),
        (lambda c: c.rollback(), "conn.rollback()"),
        (lambda c: c.close(), "conn.close()"),
        (lambda c: c.__enter__(), "conn.__enter__"),
        (lambda c: setattr(c, "autocommit", True), "conn.autocommit"),
        (lambda c: c.tpc_prepare(), "conn.tpc_prepare()"),
        (
            lambda c: c.execute("SELECT 1; COMMIT"),
            "conn.execute('SELECT 1; COMMIT', which ends the transaction with COMMIT",
        ),
        (lambda c: c.cursor().execute("ROLLBACK"), "conn.cursor.execute('ROLLBACK'"),
        (lambda c: c.cursor().executemany("END", [()]), "conn.cursor.executemany('END'"),
    ],
)
def test_ending_the_transaction_is_refused_even_when_swallowed(conn: StepConnection, how: Any, said: str) -> None:
    def work(c: Any) -> str:
        c.execute("CREATE TEMPORARY TABLE written (x int)")
        try:
            how(c)
        except TerminalError:
            pass
        return "swallowed"

    cause = _held(conn, work)
    assert isinstance(cause, TerminalError) and "'the-step'" in str(cause) and said in str(cause), cause
    assert not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE
    assert conn.execute("SELECT to_regclass('written')").fetchone() == (None,)  # rolled back, not committed
    conn.commit()  # the connection is dex's again: nothing is refused
    with conn.transaction():
        conn.execute("COMMIT")  # nor sent as SQL


def test_what_the_step_sets_serves_it_and_is_set_back(conn: StepConnection) -> None:
    def work(c: Any) -> Any:
        c.row_factory = dict_row
        c.adapters.register_dumper(str, _Refusing)
        c.prepare_threshold = None
        c.note = "an attribute of its own"
        with pytest.raises(AttributeError):
            c.adapters = None  # psycopg's to refuse: nothing to set back
        with c.transaction():  # a savepoint: the step's transaction goes on
            c.execute("SELECT 1")
        with pytest.raises(RuntimeError, match="refuses every str"):
            c.execute("SELECT %s", ["x"])
        return c.execute("SELECT 1 AS one").fetchone()

    assert _held(conn, work) == {"one": 1}
    assert conn.row_factory is tuple_row and conn.prepare_threshold == 5 and not hasattr(conn, "note")
    assert conn.execute("SELECT %s", ["dex's own"]).fetchone() == ("dex's own",)


def test_an_async_step_connection_refuses_and_sets_back_alike(pg_dsn: str) -> None:
    import asyncio

    async def main() -> tuple[Any, Any, Any]:
        conn = await StepAsyncConnection.connect(pg_dsn, cursor_factory=StepAsyncCursor)
        try:

            async def work(c: Any) -> str:
                c.row_factory = dict_row
                with pytest.raises(TerminalError):
                    await c.cursor().execute("COMMIT")
                return "swallowed"

            await conn.execute("SELECT 1")
            try:
                cause: Any = await run_held_async(conn, "async-step", work)
            except StepFailed as failed:
                cause = failed.cause
            await conn.rollback()
            row = await (await conn.execute("SELECT 1")).fetchone()
            return cause, conn.row_factory, row
        finally:
            await conn.close()

    cause, row_factory, row = asyncio.run(main())
    assert isinstance(cause, TerminalError) and "conn.cursor.execute('COMMIT'" in str(cause)
    assert row_factory is tuple_row and row == (1,)
