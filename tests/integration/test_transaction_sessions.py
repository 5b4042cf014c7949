"""A ``@dex.transaction`` step's function runs on a connection of the steps' own, and what it
does to the *session* outlives its transaction: a committed ``SET``, a session advisory lock,
``LISTEN``, a temporary table, a cursor ``WITH HOLD``. The connection then serves the next steps,
and dex's statements in their transactions; when steps ran on the pool's connections, one step's
``SET statement_timeout = 1`` had the scheduler's statements cancelled, and
``default_transaction_read_only`` every write of the engine refused, round after round
(:mod:`dex.adapters.postgres.sessions`).

Each test poisons its step's session, as a task of its own and then inside its workflow task (a
group), checks every session of the pool directly and the next step's session from inside it,
and runs healthy workflows after it, with no engine thread failing a round meanwhile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres.async_sessions import AsyncSessions
from dex.adapters.postgres.sessions import restore_query, session_restore, session_settings, settings_query
from dex.adapters.postgres.step_sessions import StepSessions
from tests.integration.step_groups import count_groups

pytestmark = pytest.mark.postgres

POOL = 3  # few connections: the poisoned one is soon the engine's again

POISONS = {
    # not 1 ms: the step's own writes after it run under it, and on a loaded machine (the suite's
    # workers side by side) they take longer, failing every attempt; the check sees any value
    "statement-timeout": "SET statement_timeout = 4321",
    "read-only": "SET default_transaction_read_only = on",
    # not 1 ms: that would end the step's own transaction whenever it sits idle for 1 ms between two
    # statements (a retried attempt, each retry again, beyond the test's wait); the check sees any value
    "set-config": "SELECT set_config('idle_in_transaction_session_timeout', '4321', false)",
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
       (SELECT count(*) FROM pg_cursors WHERE name <> ''),  -- not this query's own portal
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


@dex.transaction(name="reports-its-session-sync")
def reports_its_session_sync(conn: Any) -> list[Any]:
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()
    row = conn.execute(_CHECK).fetchone()
    return [pid[0], *row]


@dex.workflow(name="sync-reporter")
async def sync_reporter(ctx: dex.WorkflowContext) -> list[Any]:
    result: list[Any] = await ctx.activity(reports_its_session_sync)
    return result


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
    groups = count_groups(adapter)
    engine = dex.Engine(
        adapter,
        [poisoner, healthy, sync_reporter],
        [changes_its_session, counts, plain, reports_its_session_sync],
        inline_activity_seconds=0.5,
    )
    engine.start()
    try:
        # first as a task of its own (its duration is not known yet), then in a group
        for _ in range(2):
            assert engine.wait(engine.start_workflow(poisoner, POISONS[poison]), timeout=30) == "changed"
        assert groups, "the second poisoning step was to run in a group"
        assert _sessions(adapter) == [clean] * POOL
        # the next step's session is the one given back last (the poisoned one), restored
        assert engine.wait(engine.start_workflow(sync_reporter), timeout=30)[1:] == list(clean)
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


def test_step_sessions_close_idle_connections_after_a_while_beyond_the_limit_and_once_ended(pg_dsn: str) -> None:
    now = [0.0]
    sessions = StepSessions(pg_dsn, settings_query(), session_restore(), keep=1, idle_for=60.0, clock=lambda: now[0])

    def pid(conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        return int(row[0]) if row is not None else 0

    first, second = sessions.take(), sessions.take()
    assert first.autocommit and tuple(first.execute(_CHECK).fetchone() or ()) == _clean(pg_dsn)
    first_pid, second_pid = pid(first), pid(second)
    sessions.give_back(first)
    sessions.give_back(second)  # one is kept at most: this one is closed
    assert second.closed and not first.closed
    again = sessions.take()
    assert again is first and pid(again) == first_pid != second_pid
    with psycopg.connect(pg_dsn, autocommit=True) as admin:  # its session ended (a step's overrun)
        admin.execute("SELECT pg_terminate_backend(%s)", [first_pid])
    with pytest.raises(psycopg.OperationalError):
        again.execute("SELECT 1")
    sessions.give_back(again)  # not kept
    assert again.closed
    fresh = sessions.take()
    assert fresh is not first and pid(fresh) != first_pid
    sessions.give_back(fresh)
    now[0] += 61  # idle too long: closed when the next step asks
    newer = sessions.take()
    assert newer is not fresh and fresh.closed
    sessions.give_back(newer)
    sessions.close()  # the idle one goes now, and one given back later goes at once
    assert newer.closed
    late = sessions.take()
    sessions.give_back(late)
    assert late.closed


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


# -- async def steps: their own connections, kept between steps (async_sessions.py) -----------


@dex.transaction(name="changes-its-session-async")
async def changes_its_session_async(conn: Any, statement: str) -> int:
    await conn.execute(statement)
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    return int(row[0])


@dex.transaction(name="reports-its-session")
async def reports_its_session(conn: Any) -> list[Any]:
    pid = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    row = await (await conn.execute(_CHECK)).fetchone()
    return [pid[0], *row]


@dex.workflow(name="async-poisoner")
async def async_poisoner(ctx: dex.WorkflowContext, statement: str) -> int:
    result: int = await ctx.activity(changes_its_session_async, statement)
    return result


@dex.workflow(name="reporter")
async def reporter(ctx: dex.WorkflowContext) -> list[Any]:
    result: list[Any] = await ctx.activity(reports_its_session)
    return result


ASYNC_STEPS = [changes_its_session_async, reports_its_session]


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_what_an_async_step_does_to_its_session_stays_with_the_step(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, caplog: pytest.LogCaptureFixture, poison: str
) -> None:
    caplog.set_level(logging.WARNING, logger="dex.runner")
    clean = list(_clean(pg_dsn))
    engine = dex.Engine(make_adapter(max_connections=POOL + 6), [async_poisoner, reporter], ASYNC_STEPS)
    engine.start()
    try:
        before = engine.wait(engine.start_workflow(reporter), timeout=30)
        for _ in range(6):  # psycopg prepares dex's own statements on the session after a few steps
            assert engine.wait(engine.start_workflow(reporter), timeout=30)[0] == before[0]
        poisoned = engine.wait(engine.start_workflow(async_poisoner, POISONS[poison]), timeout=30)
        assert poisoned == before[0]  # the same session all along
        after = engine.wait(engine.start_workflow(reporter), timeout=30)
    finally:
        engine.stop(timeout=10)
    assert after[1:] == clean
    # kept and restored (a DEALLOCATE that psycopg saw keeps it too: psycopg forgets its statements
    # then; one it did not see closes it, as test_a_session_whose_prepared_statements_... shows)
    assert after[0] == poisoned or poison == "deallocate", (poison, before[0], poisoned, after[0])
    assert _engine_failures(caplog) == []


def test_an_async_sessions_idle_connections_are_closed_after_a_while_and_beyond_the_limit(pg_dsn: str) -> None:
    now = [0.0]
    sessions = AsyncSessions(pg_dsn, settings_query(), restore_query(), keep=1, idle_for=60.0, clock=lambda: now[0])
    level = psycopg.IsolationLevel.READ_COMMITTED

    async def pid(conn: psycopg.AsyncConnection) -> int:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        await conn.commit()
        return int(row[0]) if row is not None else 0

    async def scenario() -> None:
        first, second = await sessions.take(level), await sessions.take(level)
        first_pid, second_pid = await pid(first), await pid(second)
        await sessions.give_back(first)
        await sessions.give_back(second)  # one is kept at most: this one is closed
        assert second.closed and not first.closed
        again = await sessions.take(level)
        assert again is first and await pid(again) == first_pid != second_pid
        await sessions.give_back(again)
        now[0] += 61  # idle too long: closed when the next step asks
        fresh = await sessions.take(level)
        assert fresh is not first and first.closed
        await sessions.give_back(fresh)
        sessions.close()  # the idle one goes now, and one given back later goes at once
        assert fresh.closed
        late = await sessions.take(level)
        await sessions.give_back(late)
        assert late.closed

    asyncio.run(scenario())


def test_an_idle_async_session_the_server_ended_is_replaced_and_the_next_step_completes(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex.runner")
    engine = dex.Engine(make_adapter(), [reporter], ASYNC_STEPS)
    engine.start()
    try:
        first = engine.wait(engine.start_workflow(reporter), timeout=30)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:  # the store fails between two steps
            admin.execute("SELECT pg_terminate_backend(%s)", [first[0]])
        after = engine.wait(engine.start_workflow(reporter), timeout=30)
    finally:
        engine.stop(timeout=10)
    assert after[0] != first[0] and after[1:] == list(_clean(pg_dsn))
    assert _engine_failures(caplog) == []


def _servers_list(conn: psycopg.Connection) -> Any:
    """The restore's last result on ``conn``: the session's prepared statements, as the server lists them."""
    cursor = conn.execute(restore_query(), prepare=False)
    while cursor.nextset():
        pass
    return cursor.fetchone()


def test_psycopgs_record_of_its_prepared_statements_is_where_the_restore_reads_it(pg_dsn: str) -> None:
    # the one piece of psycopg's private state dex reads (sessions.prepared_by_psycopg), on the
    # versions it was checked on: failing here after an upgrade of psycopg means checking where
    # psycopg keeps the names now, and widening sessions.PREPARED_RECORD_CHECKED
    from dex.adapters.postgres import sessions

    with psycopg.connect(pg_dsn, prepare_threshold=0, autocommit=True) as conn:
        assert sessions.prepared_by_psycopg(conn) == set()
        conn.execute("SELECT %s::int", [1])
        prepared = sessions.prepared_by_psycopg(conn)
        assert prepared is not None and len(prepared) == 1, prepared
        assert not sessions.missing_prepared(conn, _servers_list(conn))
        conn.pgconn.exec_(b"DEALLOCATE ALL")  # past psycopg: its record now names a statement that is gone
        assert sessions.prepared_by_psycopg(conn) == prepared
        assert sessions.missing_prepared(conn, _servers_list(conn))
