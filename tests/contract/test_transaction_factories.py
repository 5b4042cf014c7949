"""The in-memory adapter's connection factory (``InMemoryAdapter(transaction_connection=)``) given
connections that are not what dex expects.

* A connection that is no psycopg connection at all, whose ``adapters`` and ``_adapters`` raise
  when read (the guard in the application layer once replaced ``_adapters``; on such an object
  that failed, and the attempt was given back as the store's failure, forever): the step runs
  on it and commits.
* A factory that fails (its database gone): the store's failure, so the attempt is given back and retried with backoff, never spending the step's attempts and never
  in a hot loop; ``drain()``, whose virtual clock skips the backoff, raises after many rounds,
  naming the step and the failure. A healthy run completes afterwards.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.activities.transaction_steps import STUCK_ROUNDS
from dex.testing import VirtualClock


class NotPsycopg:
    """A connection of the test's own: records what it is asked; its factory fails while
    ``down``, counting its calls."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.asked = 0
        self.sent: list[str] = []
        self.ended: list[str] = []

    def factory(self) -> NotPsycopg:
        self.asked += 1
        if self.down:
            raise OSError("the factory's database is gone")
        return self

    @property
    def adapters(self) -> Any:
        raise RuntimeError("not a psycopg connection: no adapters")

    @property
    def _adapters(self) -> Any:
        raise RuntimeError("not a psycopg connection: no _adapters")

    def execute(self, query: str) -> str:
        self.sent.append(query)
        return "done"

    def commit(self) -> None:
        self.ended.append("commit")

    def rollback(self) -> None:
        self.ended.append("rollback")


@dex.transaction(name="writes-through-the-factory")
def writes(conn: Any, note: str) -> str:
    return str(conn.execute(f"INSERT {note}"))


@dex.activity(name="plain-step")
def plain(note: str) -> str:
    return note + "!"


@dex.workflow(name="factory-step")
async def factory_step(ctx: dex.WorkflowContext, note: str) -> str:
    result: str = await ctx.activity(writes, note)
    return result


@dex.workflow(name="no-factory-step")
async def no_factory_step(ctx: dex.WorkflowContext, note: str) -> str:
    result: str = await ctx.activity(plain, note)
    return result


def _engine(conn: NotPsycopg) -> dex.Engine:
    store = InMemoryAdapter(clock=VirtualClock(), transaction_connection=conn.factory)
    return dex.Engine(store, [factory_step, no_factory_step], [writes, plain])


def test_a_connection_that_is_not_psycopgs_serves_the_step() -> None:
    conn = NotPsycopg()
    engine = _engine(conn)
    run_id = engine.start_workflow(factory_step, "a")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "done"
    assert conn.sent == ["INSERT a"] and conn.ended == ["commit"]


def test_a_factory_that_fails_every_time_makes_drain_raise_naming_it() -> None:
    conn = NotPsycopg(down=True)
    engine = _engine(conn)
    run_id = engine.start_workflow(factory_step, "stuck")
    with pytest.raises(RuntimeError, match="writes-through-the-factory") as raised:
        engine.drain()
    assert "the factory's database is gone" in str(raised.value) and run_id in str(raised.value)
    assert STUCK_ROUNDS <= conn.asked <= STUCK_ROUNDS + 1  # many rounds, then it stopped
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING  # no attempt spent: not failed
    conn.down = False  # the database is back: the same attempt runs again and commits
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "done"
    healthy = engine.start_workflow(factory_step, "healthy")
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "done"


def test_a_started_engine_retries_a_failing_factory_with_backoff() -> None:
    conn = NotPsycopg(down=True)
    store = InMemoryAdapter(transaction_connection=conn.factory)  # the real clock: backoffs are waited out
    engine = dex.Engine(store, [factory_step, no_factory_step], [writes, plain])
    engine.start()
    try:
        run_id = engine.start_workflow(factory_step, "stuck")
        deadline = time.monotonic() + 10
        while not conn.asked and time.monotonic() < deadline:
            time.sleep(0.01)
        # a healthy run completes meanwhile, on the same engine
        assert engine.wait(engine.start_workflow(no_factory_step, "healthy"), timeout=10) == "healthy!"
        time.sleep(1.0)
        # retried after a backoff of about a second, then two: not in a loop (thousands a second)
        assert 1 <= conn.asked <= 3, conn.asked
        assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    finally:
        engine.stop(timeout=10)
