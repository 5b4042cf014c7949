"""Transaction steps (``@dex.transaction``, docs/reference/contract.md §9) on both adapters, driven by ``drain()``.

On PostgreSQL the step's connection is a transaction of the engine's own database and the test
ledger is a table in the test's own schema (a schema other than the default); on the in-memory
adapter the connection comes from ``InMemoryAdapter(transaction_connection=...)``, here a
shared SQLite connection. Either way the function's writes must be committed exactly when the
step's completion is, and rolled back with any failure of the attempt.
"""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain import events as ev
from dex.testing import VirtualClock

FAST = dex.RetryPolicy(initial_delay=timedelta(milliseconds=10), max_attempts=3, randomization_factor=0)
ONCE = dex.RetryPolicy(max_attempts=1)


@attrs.define
class Ledger:
    """Where the steps write: the table's name and the driver's placeholder."""

    table: str = "ledger"
    mark: str = "?"
    attempts: dict[str, int] = attrs.Factory(dict)  # attempts per (run, step) key
    plan: dict[str, list[str]] = attrs.Factory(dict)  # per step: how its attempts end, in turn
    seen: dict[str, list[int]] = attrs.Factory(dict)  # per step of record-once: its attempts' numbers


LEDGER = Ledger()


def _insert(conn: Any, run_id: str, step: str) -> Any:
    return conn.execute(
        f"INSERT INTO {LEDGER.table} (run_id, step) VALUES ({LEDGER.mark}, {LEDGER.mark})", (run_id, step)
    )


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _then(step: str) -> None:
    """Act out the next planned ending of ``step``'s attempt (after its insert)."""
    key = step
    attempt = LEDGER.attempts[key] = LEDGER.attempts.get(key, 0) + 1
    plan = LEDGER.plan.get(step, [])
    how = plan[attempt - 1] if attempt <= len(plan) else "ok"
    if how == "raise":
        raise ValueError(f"attempt {attempt} of {step} failed")
    if how == "terminal":
        raise dex.TerminalError(f"{step} refused")
    if how == "interrupt":
        raise KeyboardInterrupt("from the step")
    if how == "unprintable":
        raise Unprintable()


@dex.transaction(name="record-step", retry=FAST)
def record(conn: Any, run_id: str, step: str) -> str:
    _insert(conn, run_id, step)
    _then(step)
    return f"{step} recorded"


@dex.transaction(name="record-async", retry=FAST)
async def record_async(conn: Any, run_id: str, step: str) -> str:
    done = _insert(conn, run_id, step)
    if inspect.isawaitable(done):
        await done
    _then(step)
    return f"{step} recorded asynchronously"


@dex.transaction(name="misuse", retry=FAST)
def misuse(conn: Any, run_id: str, how: str) -> None:
    _insert(conn, run_id, how)
    if how == "swallowed":
        try:
            conn.commit()
        except dex.TerminalError:
            pass
        return
    getattr(conn, how)()


@dex.transaction(name="record-once", retry=ONCE)
def record_once(conn: Any, run_id: str, step: str) -> str:
    """``record`` with a single attempt allowed; its attempt numbers are kept in ``LEDGER.seen``."""
    LEDGER.seen.setdefault(step, []).append(dex.activity_context().attempt)
    _insert(conn, run_id, step)
    _then(step)
    return f"{step} recorded"


@dex.workflow(name="three-once")
async def three_once(ctx: dex.WorkflowContext, label: str) -> list[str]:
    return [await ctx.activity(record_once, ctx.run_id, f"{label}-{n}") for n in range(3)]


@dex.workflow(name="three-steps")
async def three_steps(ctx: dex.WorkflowContext, label: str) -> list[str]:
    return [await ctx.activity(record, ctx.run_id, f"{label}-{n}") for n in range(3)]


@dex.workflow(name="async-steps")
async def async_steps(ctx: dex.WorkflowContext, label: str) -> list[str]:
    return [await ctx.activity(record_async, ctx.run_id, f"{label}-{n}") for n in range(2)]


@dex.workflow(name="misusing")
async def misusing(ctx: dex.WorkflowContext, how: str) -> None:
    await ctx.activity(misuse, ctx.run_id, how)


WORKFLOWS = [three_steps, async_steps, misusing, three_once]
ACTIVITIES = [record, record_async, misuse, record_once]


@attrs.frozen
class Env:
    engine: dex.Engine
    rows: Callable[[], list[tuple[str, str]]]


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    clock = VirtualClock()
    LEDGER.attempts.clear()
    LEDGER.plan.clear()
    LEDGER.seen.clear()
    if request.param == "memory":
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute("CREATE TABLE ledger (run_id TEXT, step TEXT)")
        db.commit()
        LEDGER.table, LEDGER.mark = "ledger", "?"
        engine = dex.Engine(
            InMemoryAdapter(clock=clock, transaction_connection=lambda: db), WORKFLOWS, ACTIVITIES, rng=_rng()
        )
        yield Env(engine, lambda: sorted(db.execute("SELECT run_id, step FROM ledger").fetchall()))
        return
    import psycopg

    from dex.adapters.postgres import PostgresAdapter
    from tests.pg import fresh_schema, postgres_dsn

    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, clock=clock, max_connections=4)
        LEDGER.table, LEDGER.mark = f'"{schema}".ledger', "%s"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {LEDGER.table} (run_id text, step text)")  # no unique constraint

        def rows() -> list[tuple[str, str]]:
            with psycopg.connect(dsn) as conn:
                return sorted(conn.execute(f"SELECT run_id, step FROM {LEDGER.table}").fetchall())

        engine = dex.Engine(adapter, WORKFLOWS, ACTIVITIES, rng=_rng())
        try:
            yield Env(engine, rows)
        finally:
            engine.stop(timeout=5)
            adapter.close()


def _rng() -> Any:
    import random

    return random.Random(7)


def _completed(engine: dex.Engine, run_id: str) -> list[str]:
    return [type(e.event).__name__ for e in engine.history(run_id) if "Activity" in type(e.event).__name__]


def test_each_step_commits_its_writes_with_its_completion(env: Env) -> None:
    run_id = env.engine.start_workflow(three_steps, "order")
    env.engine.drain()
    assert env.engine.wait(run_id, timeout=5) == [f"order-{n} recorded" for n in range(3)]
    assert env.rows() == [(run_id, f"order-{n}") for n in range(3)]
    assert _completed(env.engine, run_id) == ["ActivityTaskCreated", "ActivityTaskCompleted"] * 3


def test_a_failed_attempt_rolls_back_and_is_retried(env: Env) -> None:
    LEDGER.plan["retry-0"] = ["raise", "interrupt"]
    run_id = env.engine.start_workflow(three_steps, "retry")
    env.engine.drain()
    assert env.engine.wait(run_id, timeout=5)[0] == "retry-0 recorded"
    assert LEDGER.attempts["retry-0"] == 3
    assert env.rows() == [(run_id, f"retry-{n}") for n in range(3)]  # one row each: two attempts rolled back


@pytest.mark.parametrize("how", ["terminal", "unprintable"])
def test_a_final_failure_leaves_nothing_and_a_healthy_run_still_completes(env: Env, how: str) -> None:
    LEDGER.plan[f"{how}-0"] = [how] * 3
    run_id = env.engine.start_workflow(three_steps, how)
    env.engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        env.engine.wait(run_id, timeout=5)
    assert "Unprintable" in str(failed.value) or "refused" in str(failed.value)
    assert env.rows() == []
    healthy = env.engine.start_workflow(three_steps, "healthy")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3
    assert [step for _, step in env.rows()] == [f"healthy-{n}" for n in range(3)]


@pytest.mark.parametrize("how", ["commit", "rollback", "close", "swallowed"])
def test_ending_the_transaction_from_the_function_is_a_terminal_error_naming_the_step(env: Env, how: str) -> None:
    run_id = env.engine.start_workflow(misusing, how)
    env.engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        env.engine.wait(run_id, timeout=5)
    text = str(failed.value) + str(failed.value.__cause__)
    assert "'misuse'" in text and "conn." in text
    history = env.engine.history(run_id)
    (failure,) = [e.event.failure for e in history if isinstance(e.event, ev.ActivityTaskFailed)]
    assert failure.terminal
    assert env.rows() == []  # its insert was rolled back
    healthy = env.engine.start_workflow(three_steps, "after")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3


def test_an_async_step_commits_and_rolls_back_the_same_way(env: Env) -> None:
    LEDGER.plan["async-0"] = ["raise"]
    run_id = env.engine.start_workflow(async_steps, "async")
    env.engine.drain()
    assert env.engine.wait(run_id, timeout=5) == ["async-0 recorded asynchronously", "async-1 recorded asynchronously"]
    assert env.rows() == [(run_id, "async-0"), (run_id, "async-1")]


def test_a_started_engine_writes_each_step_exactly_once(env: Env) -> None:
    env.engine.start()
    runs = [env.engine.start_workflow(three_steps, f"bg{n}") for n in range(4)]
    for run_id in runs:
        assert len(env.engine.wait(run_id, timeout=20)) == 3
    assert len(env.rows()) == 12  # the started engine wrote each exactly once


def test_names_with_nul_or_surrogates_are_refused_where_they_are_declared() -> None:
    for bad in ("a\x00b", "s\ud800", ""):
        with pytest.raises(ValueError, match="activity name"):
            dex.transaction(name=bad)(lambda conn: None)
    with pytest.raises(ValueError, match="isolation"):
        dex.transaction(isolation="chaos")
    with pytest.raises(TypeError, match="retry"):
        dex.transaction(retry=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="connection"):
        dex.transaction(lambda: None)


@dex.transaction(name="counts-without-its-connection")
def ignores_its_connection(conn: Any, x: int) -> int:
    return x * 2


@dex.workflow(name="steps-without-a-factory")
async def steps_without_a_factory(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(ignores_its_connection, x) + await ctx.activity(ignores_its_connection, 1)


def test_without_a_connection_factory_a_step_that_does_not_use_it_runs() -> None:
    # docs/reference/contract.md §9: the factory is None by default, and workflows with steps still test with drain()
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), [steps_without_a_factory], [ignores_its_connection])
    run_id = engine.start_workflow(steps_without_a_factory, 20)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 42


def test_the_memory_adapter_without_a_connection_factory_fails_the_step_clearly() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(three_steps, "nofactory")
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError) as failed:
        engine.wait(run_id, timeout=5)
    assert "transaction_connection" in str(failed.value) + str(failed.value.__cause__)
    with pytest.raises(TypeError, match="connection= needs the PostgreSQL adapter"):
        engine.start_workflow(three_steps, "x", connection=object())
    with pytest.raises(TypeError, match="connection= needs the PostgreSQL adapter"):
        engine.send_event(run_id, "paid", connection=object())
    with pytest.raises(TypeError, match="transaction_connection"):
        InMemoryAdapter(transaction_connection="sqlite://")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        InMemoryAdapter(connection=object())  # type: ignore[call-arg]


def test_args_with_nul_fail_only_their_own_run(env: Env) -> None:
    bad = env.engine.start_workflow(three_steps, "nul\x00here")
    env.engine.drain()
    healthy = env.engine.start_workflow(three_steps, "fine")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3
    outcome: Any
    try:
        outcome = env.engine.wait(bad, timeout=5)
    except dex.WorkflowFailedError as exc:
        outcome = exc
    # SQLite stores the NUL; PostgreSQL refuses it (a failed attempt, retried, then the run fails)
    assert isinstance(outcome, (list, dex.WorkflowFailedError))
    assert ("fine-0" in [step for _, step in env.rows()]) and len([r for r in env.rows() if r[0] == healthy]) == 3


@dex.transaction(name="odd-result", retry=FAST)
def odd_result(conn: Any, run_id: str) -> Any:
    _insert(conn, run_id, "odd")
    return object()  # no converter can encode it


@dex.transaction(name="beating", retry=FAST)
def beating(conn: Any, run_id: str) -> bool:
    _insert(conn, run_id, "beat")
    return dex.activity_context().heartbeat()  # must not wait for its own locked task row


@dex.workflow(name="odd")
async def odd(ctx: dex.WorkflowContext) -> Any:
    return await ctx.activity(odd_result, ctx.run_id)


@dex.workflow(name="beats")
async def beats(ctx: dex.WorkflowContext) -> Any:
    return await ctx.activity(beating, ctx.run_id)


def test_a_result_that_cannot_be_stored_is_terminal_and_rolls_back(env: Env) -> None:
    engine = dex.Engine(env.engine.store, [odd, three_steps, beats], [odd_result, record, beating])
    run_id = engine.start_workflow(odd)
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError):
        engine.wait(run_id, timeout=5)
    assert env.rows() == []
    beat = engine.start_workflow(beats)
    engine.drain()
    assert engine.wait(beat, timeout=5) is True
    assert env.rows() == [(beat, "beat")]


class FlakyStore(InMemoryAdapter):
    """Fails the first completion it is asked to write: mid-call, after the step's function ran."""

    failures = 1

    def complete_activity_tasks(self, outcomes: Any, now: Any) -> list[bool]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the store went away")
        return super().complete_activity_tasks(outcomes, now)


def test_the_store_failing_mid_call_rolls_the_step_back_and_a_retry_commits_once() -> None:
    LEDGER.attempts.clear()
    LEDGER.plan.clear()
    LEDGER.table, LEDGER.mark = "ledger", "?"
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("CREATE TABLE ledger (run_id TEXT, step TEXT)")
    store = FlakyStore(clock=VirtualClock(), transaction_connection=lambda: db)
    engine = dex.Engine(store, WORKFLOWS, ACTIVITIES)
    run_id = engine.start_workflow(three_steps, "flaky")
    engine.drain()
    assert len(engine.wait(run_id, timeout=5)) == 3
    assert LEDGER.attempts["flaky-0"] == 2  # the first attempt's completion failed: rolled back, run again
    assert sorted(db.execute("SELECT step FROM ledger").fetchall()) == [("flaky-0",), ("flaky-1",), ("flaky-2",)]
    healthy = engine.start_workflow(three_steps, "steady")
    engine.drain()
    assert len(engine.wait(healthy, timeout=5)) == 3
