"""A ``@dex.transaction`` step's function runs on a pooled connection, and what it does to the
*session* outlives its transaction: a committed ``SET``, a session advisory lock, ``LISTEN``, a
temporary table, a cursor ``WITH HOLD``. The pool then hands that connection to the engine's
own statements for other runs; before the fix, one step's ``SET statement_timeout = 1`` had the
scheduler's statements cancelled, and ``default_transaction_read_only`` every write of the
engine refused, round after round (:mod:`dex.adapters.postgres.sessions`).

Each test poisons its step's session, as a task of its own and then inside its workflow task (a
group), checks every session of the pool directly, and runs healthy workflows after it, with no
engine thread failing a round meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.sessions import session_restore, session_settings

pytestmark = pytest.mark.postgres

POOL = 3  # few connections: the poisoned one is soon the engine's again

POISONS = {
    "statement-timeout": "SET statement_timeout = 1",
    "read-only": "SET default_transaction_read_only = on",
    "set-config": "SELECT set_config('idle_in_transaction_session_timeout', '1', false)",
    "time-zone": "SET TIME ZONE 'Asia/Tokyo'",
    "search-path": "SET search_path = nowhere",
    "plan-cache": "SET plan_cache_mode = force_generic_plan",
    "advisory-lock": "SELECT pg_advisory_lock(4242)",
    "listen": "LISTEN dex_test_channel",
    "temp-table": "CREATE TEMP TABLE scratch (x int)",
    "cursor": "DECLARE held CURSOR WITH HOLD FOR SELECT 1",
    "deallocate": "DEALLOCATE ALL",  # psycopg's statements gone: the session is closed instead
}

# what a session of dex's pool holds (sessions.session_settings), and holds nothing else
_CHECK = """
SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout'),
       current_setting('default_transaction_read_only'), current_setting('TimeZone'),
       current_setting('search_path'), current_setting('plan_cache_mode'), current_user = session_user,
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
       (SELECT count(*) FROM pg_listening_channels()),
       (SELECT count(*) FROM pg_cursors),
       (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())
"""


def _clean(dsn: str) -> tuple[Any, ...]:
    """What a session the pool just opened holds (the server's own defaults for the rest)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        session_settings()(conn)
        return tuple(conn.execute(_CHECK).fetchone() or ())


@dex.transaction(name="changes-its-session")
def changes_its_session(conn: Any, statement: str) -> str:
    conn.execute(statement)
    return "changed"


@dex.transaction(name="counts")
def counts(conn: Any, x: int) -> int:
    row = conn.execute("SELECT %s::int + 1", [x]).fetchone()
    return int(row[0])


@dex.activity(name="plain")
def plain(x: int) -> int:
    return x * 2


@dex.workflow(name="poisoner")
async def poisoner(ctx: dex.WorkflowContext, statement: str) -> str:
    result: str = await ctx.activity(changes_its_session, statement)
    return result


@dex.workflow(name="healthy")
async def healthy(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(plain, x)
    result: int = await ctx.activity(counts, x)
    return result


def _sessions(adapter: PostgresAdapter) -> list[tuple[Any, ...]]:
    """What every session of the adapter's pool holds (all of them taken out at once)."""
    adapter._kept.release()  # the start's kept connection, back in the pool to be looked at too
    pool = adapter._pool
    taken = [pool.getconn(timeout=10) for _ in range(POOL)]
    try:
        return [tuple(conn.execute(_CHECK).fetchone() or ()) for conn in taken]
    finally:
        for conn in taken:
            pool.putconn(conn)


def _engine_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dex.runner" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_what_a_step_does_to_its_session_stays_with_the_step(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, caplog: pytest.LogCaptureFixture, poison: str
) -> None:
    clean = _clean(pg_dsn)
    assert clean[0] == "30s" and clean[3] == "UTC"  # dex's own, over the server's defaults
    caplog.set_level(logging.WARNING, logger="dex.runner")
    adapter = make_adapter(max_connections=POOL)
    groups: list[int] = []
    real = adapter.checkpoint_steps

    def counted(items: Any, now: Any) -> Any:
        groups.append(len(items))
        return real(items, now)

    adapter.checkpoint_steps = counted  # type: ignore[method-assign]
    engine = dex.Engine(adapter, [poisoner, healthy], [changes_its_session, counts, plain], inline_activity_seconds=0.5)
    engine.start()
    try:
        # first as a task of its own (its duration is not known yet), then in a group
        for _ in range(2):
            assert engine.wait(engine.start_workflow(poisoner, POISONS[poison]), timeout=30) == "changed"
        assert groups, "the second poisoning step was to run in a group"
        assert _sessions(adapter) == [clean] * POOL
        run_ids = [engine.start_workflow(healthy, i) for i in range(30)]
        assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [2 * i + 1 for i in range(30)]
    finally:
        engine.stop(timeout=10)
    assert _engine_failures(caplog) == []


class _Connection:
    """A stand-in whose restore statement raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc, self.closed, self.statements = exc, False, []

    def execute(self, query: str, prepare: bool | None = None) -> None:
        self.statements.append(query)
        raise self.exc

    def close(self) -> None:
        self.closed = True


def test_a_session_that_cannot_be_restored_is_closed_and_the_steps_outcome_stands() -> None:
    restore = session_restore()
    ended = _Connection(psycopg.OperationalError("the server ended the session"))
    restore(ended)  # type: ignore[arg-type]
    assert ended.closed and "RESET ALL" in ended.statements[0]
    interrupted = _Connection(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        restore(interrupted)  # type: ignore[arg-type]
    assert interrupted.closed


def test_the_restore_gives_back_exactly_the_settings_the_pool_gave(pg_dsn: str) -> None:
    clean = _clean(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        last = {"read-only", "statement-timeout"}  # these two would keep the others from running
        for name in [*(n for n in POISONS if n not in last), "read-only"]:
            conn.execute(POISONS[name])
        conn.execute("SET statement_timeout = 4321")  # not 1 ms: the restore's own statements run under it
        assert tuple(conn.execute(_CHECK).fetchone() or ()) != clean
        session_restore()(conn)
        assert not conn.closed
        assert tuple(conn.execute(_CHECK).fetchone() or ()) == clean


def test_a_session_whose_prepared_statements_were_deallocated_is_closed(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DEALLOCATE ALL")  # psycopg has seen this text before it prepares anything
        for _ in range(6):  # prepared by psycopg after a few executions
            conn.execute("SELECT %s::int + 1", [1])
        conn.execute("DEALLOCATE ALL")  # seen before: psycopg does not notice that its statement went
        session_restore()(conn)
        assert conn.closed
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a session nothing was taken from stays open
        for _ in range(6):
            conn.execute("SELECT %s::int + 1", [1])
        session_restore()(conn)
        assert not conn.closed and conn.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)
