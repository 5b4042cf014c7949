"""Transaction steps whose code never returns do not stop other runs' steps.

A step stuck in Python (``time.sleep``, a loop: nothing its session's end can interrupt) has its
session ended at its ``lock_timeout`` by its watch; its task's lease is lost with the session.
It used to keep its step slot all the same: with the default pool (10 connections) four slots,
and four such steps stopped every other run's transaction steps for good. Now the watch that
ends the session frees the slot (the thread may run on: it is counted in
``Engine.health().lost_step_slots`` and the ``dex_lost_step_slots`` gauge until it returns),
whatever the stuck attempt returns later is dropped, and the slot count is the adapter's own
``step_connections`` (steps run on connections of their own), not what the pool leaves over.

``@dex.transaction`` takes no ``lock_timeout`` (its default is five minutes): these steps get
one second through the definition the decorator made, as in test_transaction_overruns.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.connection import DatabaseConnectionError
from dex.adapters.postgres.step_slots import AttemptLost, StepSlots
from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE
from dex.app.ports.clock import SystemClock
from tests.integration.step_groups import count_groups

pytestmark = pytest.mark.postgres

ONCE = dex.RetryPolicy(max_attempts=1)
STATE: dict[str, Any] = {}
RELEASE = threading.Event()  # set: the stuck steps return
SLOTS = 4  # PostgresAdapter's default step_connections


def _bounded(fn: Any, seconds: float = 1.0) -> Any:
    """``fn``'s definition with a ``lock_timeout`` of ``seconds``."""
    definition = getattr(fn, ACTIVITY_ATTRIBUTE)
    setattr(fn, ACTIVITY_ATTRIBUTE, attrs.evolve(definition, lock_timeout=timedelta(seconds=seconds)))
    return fn


@_bounded
@dex.transaction(name="stuck-in-python", retry=ONCE)
def stuck_in_python(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    RELEASE.wait(120)  # as time.sleep: the end of its session does not reach it
    return note


@_bounded
@dex.transaction(name="stuck-async", retry=ONCE)
async def stuck_async(conn: Any, note: str) -> str:
    await conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    while not RELEASE.is_set():  # awaits nothing its session's end can fail
        await asyncio.sleep(0.05)
    return note


@dex.transaction(name="writes-note")  # the healthy step (five minutes' lock_timeout)
def writes_note(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    return note


@_bounded
@dex.transaction(name="waits-for-the-others")
def waits_for_the_others(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    STATE["barrier"].wait()  # passes only when all of them run at once
    return note


@_bounded
@dex.transaction(name="stuck-when-told")
def stuck_when_told(conn: Any, note: str) -> str:
    conn.execute(f"INSERT INTO {STATE['table']} (note) VALUES (%s)", [note])
    with STATE["lock"]:
        stuck = STATE["stuck"] > 0  # the first so many attempts from now on are stuck
        STATE["stuck"] -= stuck
    if stuck:
        RELEASE.wait(120)
    return note


@dex.workflow(name="one-step-of")
async def one_step_of(ctx: dex.WorkflowContext, step: str, note: str) -> str:
    result: str = await ctx.activity(step, note)
    return result


STEPS = [stuck_in_python, stuck_async, writes_note, waits_for_the_others, stuck_when_told]


@pytest.fixture
def table(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    name = sql.Identifier(pg_schema, "notes").as_string(None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(pg_schema).as_string(None)}")
        conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, note text)")
    STATE.clear()
    STATE.update(dsn=pg_dsn, table=name, lock=threading.Lock(), stuck=0)
    RELEASE.clear()
    yield name
    RELEASE.set()  # whatever happened, no thread stays stuck past the test


def _notes(table: str) -> list[str]:
    with psycopg.connect(STATE["dsn"]) as conn:
        return sorted(row[0] for row in conn.execute(f"SELECT note FROM {table}"))


def _eventually(check: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("stuck", ["stuck-in-python", "stuck-async"])
def test_more_stuck_steps_than_slots_leave_a_healthy_runs_step_to_complete(
    make_adapter: Callable[..., PostgresAdapter], table: str, stuck: str
) -> None:
    from dex.adapters.observability.prometheus import PrometheusTelemetry

    # the default pool and step slots; the wall clock: the stuck attempts' leases must run out
    engine = dex.Engine(make_adapter(clock=SystemClock()), [one_step_of], STEPS)
    metrics = PrometheusTelemetry()
    engine.telemetry.attach(metrics)
    engine.start()
    try:
        # as many stuck steps as there are slots; each loses its lease and its slot at its
        # lock_timeout, and its thread runs on (they used to keep every slot for good)
        hung = [engine.start_workflow(one_step_of, stuck, f"stuck-{i}") for i in range(SLOTS)]
        assert _eventually(lambda: engine.health().lost_step_slots == SLOTS), engine.health()
        # one more, and a healthy run's step (started after the others have their slots: a step
        # that waits for one longer than its lease is taken over before it runs)
        hung.append(engine.start_workflow(one_step_of, stuck, f"stuck-{SLOTS}"))
        healthy = engine.start_workflow(one_step_of, "writes-note", "healthy")
        assert engine.wait(healthy, timeout=30) == "healthy"
        assert _eventually(lambda: engine.health().lost_step_slots == SLOTS + 1), engine.health()
        assert not engine.health().ok
        assert _eventually(lambda: metrics.registry.get_sample_value("dex_lost_step_slots") == SLOTS + 1)
        for run_id in hung:  # a single attempt, lost: the run fails (its code may catch it)
            with pytest.raises(dex.WorkflowFailedError):
                engine.wait(run_id, timeout=30)
        failures = {run_id: engine.get_run(run_id).failure for run_id in hung}

        RELEASE.set()  # the stuck attempts return their results now: dropped
        assert _eventually(lambda: engine.health().lost_step_slots == 0), engine.health()
        assert _eventually(lambda: metrics.registry.get_sample_value("dex_lost_step_slots") == 0)
        assert {run_id: engine.get_run(run_id).failure for run_id in hung} == failures
        assert all(engine.get_run(run_id).status == dex.RunStatus.FAILED for run_id in hung)
        after = engine.start_workflow(one_step_of, "writes-note", "after")
        assert engine.wait(after, timeout=30) == "after"
    finally:
        RELEASE.set()
        engine.stop(timeout=10)
    assert _notes(table) == ["after", "healthy"]  # nothing a stuck step wrote stayed
    assert engine.health().lost_step_slots == 0


def test_groups_stuck_in_python_leave_the_next_runs_steps_to_their_own_groups(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    """A step quick enough to run in groups (first attempts inside their workflow tasks) gets
    stuck in two groups, one after the other: as many as the engine has group threads. The next
    runs' steps still go in groups, on threads of their own, and complete; the stuck groups'
    slots are counted as lost once their sessions are ended; released, nothing they ran stays."""
    adapter = make_adapter(clock=SystemClock())
    groups = count_groups(adapter)
    engine = dex.Engine(adapter, [one_step_of], STEPS, inline_activity_seconds=0.5)
    engine.start()
    try:
        for i in range(3):  # quick: from the second on, in groups
            assert engine.wait(engine.start_workflow(one_step_of, "stuck-when-told", f"warm-{i}"), timeout=30)
        assert groups, "the warm-up steps were to run in groups"
        for i in range(2):
            seen = len(groups)
            with STATE["lock"]:
                STATE["stuck"] = 1
            stuck = engine.start_workflow(one_step_of, "stuck-when-told", f"stuck-{i}")
            # its group is under way, stuck
            assert _eventually(lambda seen=seen: STATE["stuck"] == 0 and len(groups) > seen), (stuck, groups)
        before = len(groups)
        healthy = [engine.start_workflow(one_step_of, "stuck-when-told", f"healthy-{i}") for i in range(5)]
        assert [engine.wait(run_id, timeout=30) for run_id in healthy] == [f"healthy-{i}" for i in range(5)]
        assert sum(groups[before:]) >= 5, groups  # in groups, not taken over after their leases
        assert _eventually(lambda: engine.health().lost_step_slots == 2), engine.health()
        RELEASE.set()
        assert _eventually(lambda: engine.health().lost_step_slots == 0), engine.health()
        after = engine.start_workflow(one_step_of, "writes-note", "after")
        assert engine.wait(after, timeout=30) == "after"
    finally:
        RELEASE.set()
        engine.stop(timeout=10)
    notes = _notes(table)
    assert [note for note in notes if note.startswith("healthy")] == [f"healthy-{i}" for i in range(5)]
    assert notes.count("stuck-0") <= 1 and notes.count("stuck-1") <= 1  # run again as tasks, once


def test_the_step_slots_are_the_adapters_own_setting_not_what_the_pool_leaves(
    make_adapter: Callable[..., PostgresAdapter], table: str
) -> None:
    """Three steps that each wait until all three run at once, on an adapter whose pool has four
    connections (from which the slots were once the pool's size less six: one) and
    ``step_connections=3``; a healthy step afterwards."""
    STATE["barrier"] = threading.Barrier(3, timeout=20)
    adapter = make_adapter(max_connections=4, step_connections=3, clock=SystemClock())
    engine = dex.Engine(adapter, [one_step_of], STEPS)
    engine.start()
    try:
        run_ids = [engine.start_workflow(one_step_of, "waits-for-the-others", f"together-{i}") for i in range(3)]
        assert [engine.wait(run_id, timeout=60) for run_id in run_ids] == [f"together-{i}" for i in range(3)]
        healthy = engine.start_workflow(one_step_of, "writes-note", "healthy")
        assert engine.wait(healthy, timeout=30) == "healthy"
    finally:
        engine.stop(timeout=10)
    assert _notes(table) == ["healthy", "together-0", "together-1", "together-2"]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4", None])
def test_a_bad_step_connections_is_refused_naming_it(
    make_adapter: Callable[..., PostgresAdapter], table: str, bad: Any
) -> None:
    with pytest.raises(ValueError, match="step_connections"):
        make_adapter(step_connections=bad)
    engine = dex.Engine(make_adapter(step_connections=1), [one_step_of], STEPS)  # the fewest that work
    run_id = engine.start_workflow(one_step_of, "writes-note", "one")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "one"
    assert _notes(table) == ["one"]


# -- the slots themselves ------------------------------------------------------------------------


def test_a_lost_slot_is_free_at_once_and_counted_until_its_attempt_returns() -> None:
    slots = StepSlots(1, wait=0.2)
    with slots.held() as stuck:
        stuck.check()  # held: nothing to drop
        stuck.lose()  # its session was ended
        stuck.lose()  # at most once
        assert slots.lost == 1
        with pytest.raises(AttemptLost):
            stuck.check()  # what it returns now is dropped
        with slots.held() as next_one:  # the slot serves the next step meanwhile
            assert slots.lost == 1 and not next_one.lost
        with slots.held():
            pass
    assert slots.lost == 0  # the stuck attempt returned
    with slots.held() as a, pytest.raises(DatabaseConnectionError, match="no transaction step slot"):
        with slots.held():  # the one slot is taken, none is lost: the wait ends
            pass
    a.lose()  # lost after it was given back: nothing
    assert slots.lost == 0
    with slots.held() as b:  # still exactly one slot
        assert not b.lost
        with pytest.raises(DatabaseConnectionError):
            with slots.held():
                pass
