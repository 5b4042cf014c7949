"""Migrations are history: what they make is pinned, and every older database upgrades with its
runs in flight (migrations are frozen once released).

* The snapshot: the migrations applied to an empty schema make exactly the objects described
  in ``schema_snapshot.txt`` (read from the catalogs by ``schema_catalog.describe_schema``).
  After adding a migration, regenerate it with
  ``DEX_UPDATE_SCHEMA_SNAPSHOT=1 pytest tests/integration/test_migrations.py -k snapshot``
  and review the diff: a released migration's part of it never changes.
* The upgrades: a schema at each older version, holding runs at every stage a run can be
  left in by a stopped engine, is upgraded to the newest and an engine then completes them.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import LATEST_VERSION, PostgresAdapter, migrate
from dex.adapters.postgres.schema import create_partition
from dex.testing import VirtualClock
from tests.integration.schema_catalog import describe_schema
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres

SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")
UPDATE_SNAPSHOT = "DEX_UPDATE_SCHEMA_SNAPSHOT"
REGENERATE = f"{UPDATE_SNAPSHOT}=1 pytest tests/integration/test_migrations.py -k snapshot"
HEADER = (
    "# The schema the migrations make from nothing, as the catalogs describe it (PostgreSQL 16):\n"
    "# see tests/integration/test_migrations.py. Regenerate only after adding a migration:\n"
    f"#   {REGENERATE}\n"
)


def without_comments(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def test_the_migrations_make_the_schema_of_the_snapshot(pg_dsn: str, pg_schema: str) -> None:
    assert migrate(pg_dsn, pg_schema) == LATEST_VERSION
    with psycopg.connect(pg_dsn) as conn:
        described = describe_schema(conn, pg_schema)
    if os.environ.get(UPDATE_SNAPSHOT):
        SNAPSHOT.write_text(HEADER + described)
        pytest.skip(f"{SNAPSHOT.name} rewritten: review its diff (git diff {SNAPSHOT.name}) before committing it")
    assert described == without_comments(SNAPSHOT.read_text()), (
        f"the schema the migrations make differs from {SNAPSHOT.name}. A released migration must not change "
        "(databases it made would differ from new ones): add a new migration instead. After adding one, "
        f"regenerate the snapshot with `{REGENERATE}` and review its diff"
    )


# -- upgrades with runs in flight -----------------------------------------------------------


@dex.activity(name="double", queue="acts")
def double(x: int) -> int:
    return 2 * x


@dex.workflow(name="trip", queue="main")
async def trip(ctx: dex.WorkflowContext, x: int) -> list[object]:
    doubled = await ctx.activity(double, x)
    await ctx.sleep(timedelta(hours=1))
    note = await ctx.wait_for_event("note")
    return [doubled, note, await ctx.activity(double, doubled)]


WORKFLOWS = [trip]
ACTIVITIES = [double]
TABLES = ("queues", "runs", "history", "inbox", "workflow_tasks", "activity_tasks")


class InFlight:
    """A schema at the newest version whose runs a stopped engine left at every stage."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.clock = VirtualClock()
        adapter = PostgresAdapter(dsn, schema=schema, clock=self.clock)
        try:
            engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES, rng=random.Random(5))
            # a node that claims and then dies: its results stay in its buffer, never flushed
            dead = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES, node_id="dead-node")
            self.runs = {"noted": engine.start_workflow(trip, 1)}
            engine.drain()  # its activity, its hour's sleep: it waits for its note
            self.runs["sleeping"] = engine.start_workflow(trip, 2)
            engine.drain(advance_time=False)  # its activity: its timer is an hour away
            self.runs["claimed by a dead node"] = engine.start_workflow(trip, 3)
            engine.workflow_scheduler.step()
            assert dead.workflow_worker.poll_once() == 1
            self.runs["activity due"] = engine.start_workflow(trip, 4)
            engine.workflow_scheduler.step()
            assert engine.workflow_worker.poll_once() == 1  # the dead node's task is leased
            engine.buffer.flush()
            engine.activity_scheduler.step()
            self.runs["new"] = engine.start_workflow(trip, 5)
            engine.send_event(self.runs["noted"], "note", "early")
            self.now = self.clock.now()
        finally:
            adapter.close()
        self.dsn, self.schema = dsn, schema
        with psycopg.connect(dsn) as conn:  # the stages are there (or this test proves less)
            q = Schema(schema)
            assert q.one(conn, "SELECT count(*) FROM {s}.runs WHERE status IN ('COMPLETED', 'FAILED')") == 0
            assert q.one(conn, "SELECT count(*) FROM {s}.workflow_tasks WHERE locked_by = 'dead-node'") == 1
            assert q.one(conn, "SELECT count(*) FROM {s}.activity_tasks WHERE state = 'QUEUED'") == 1
            assert q.one(conn, "SELECT count(*) FROM {s}.inbox WHERE visible_from > %s", [self.now]) == 1
            assert q.one(conn, "SELECT count(*) FROM {s}.inbox WHERE kind <> 'RunStarted'") >= 2
            assert q.one(conn, "SELECT count(*) FROM {s}.history WHERE last_seq > first_seq") > 0


class Schema:
    """Statements on one schema (``{s}``), composed here as the live code would."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def __call__(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=sql.Identifier(self.schema))

    def one(self, conn: psycopg.Connection, text: str, params: list[object] | None = None) -> object:
        row = conn.execute(self(text), params).fetchone()
        assert row is not None
        return row[0]


@pytest.fixture(scope="module")
def in_flight() -> Iterator[InFlight]:
    with fresh_schema(postgres_dsn(), prefix="dex_inflight") as schema:
        yield InFlight(postgres_dsn(), schema)


def columns(conn: psycopg.Connection, schema: str, table: str) -> list[str]:
    """The columns a row is written with: generated ones (``queues.paused`` from 17) are not."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
        " AND is_generated = 'NEVER' ORDER BY ordinal_position",
        [schema, table],
    ).fetchall()
    return [row[0] for row in rows]


def events_of(block: bytes) -> Iterator[bytes]:
    """The events of a dex.v1.HistoryBlock, byte for byte: each is field 1 (tag 0x0a, a varint
    length, the event's bytes), as migration 5 wrote the events it found."""
    at = 0
    while at < len(block):
        assert block[at] == 0x0A, "a history block holds only field 1"
        at, size, shift = at + 1, 0, 0
        while True:
            byte = block[at]
            at, size, shift = at + 1, size | (byte & 0x7F) << shift, shift + 7
            if byte < 0x80:
                break
        yield block[at : at + size]
        at += size


# migration 15's columns of queues, and what they hold in a queue an older engine made
QUEUE_LIMITS = {"operator_paused": "paused", "key_concurrency": "1", "rate_count": "NULL", "rate_period_us": "NULL"}


def copy_in_flight(conn: psycopg.Connection, source: str, target: str, version: int) -> None:
    """Copy the rows of ``source`` (newest version) into ``target``, at ``version``, in the
    shape that version's tables have."""
    src, tgt = Schema(source), Schema(target)
    for kind, name in conn.execute(src("SELECT kind, name FROM {s}.queues")).fetchall():
        create_partition(conn, target, kind, name)
    for table in TABLES:
        have, want = columns(conn, source, table), columns(conn, target, table)
        if table == "history" and "events" not in want:  # before 5: one row per event
            for run_id, first_seq, last_seq, block in conn.execute(
                src("SELECT run_id, first_seq, last_seq, events FROM {s}.history ORDER BY run_id, first_seq")
            ).fetchall():
                events = list(events_of(block))
                assert len(events) == last_seq - first_seq + 1
                insert = tgt("INSERT INTO {s}.history (run_id, seq, event) VALUES (%s, %s, %s)")
                for seq, event in enumerate(events, start=first_seq):
                    conn.execute(insert, [run_id, seq, event])
            continue
        missing = set(have) - set(want)
        # columns that later migrations added: trace_context (2), code_version and task_failure (7),
        # forked_from (8), deadline and unread_events (13), the queues' limits (15: the operator's pause
        # is ``paused`` before it)
        added_later = (
            ({"trace_context"} if version < 2 else set())
            | ({"code_version", "task_failure"} if version < 7 and table == "runs" else set())
            | ({"forked_from"} if version < 8 and table == "runs" else set())
            | ({"deadline", "unread_events"} if version < 13 and table == "runs" else set())
            | (set(QUEUE_LIMITS) if version < 15 and table == "queues" else set())
        )
        assert missing <= added_later, (table, missing)
        for column in missing:  # nothing is lost: an engine without tracing or a code version writes none
            # (unread_events is 0 where nothing was left unread, as before migration 13)
            if column == "unread_events":
                unset = f"{column} <> 0"
            elif column in QUEUE_LIMITS:
                unset = f"{column} IS DISTINCT FROM {QUEUE_LIMITS[column]}"
            else:
                unset = f"{column} IS NOT NULL"
            assert src.one(conn, f"SELECT count(*) FROM {{s}}.{table} WHERE {unset}") == 0
        names = sql.SQL(", ").join(map(sql.Identifier, [c for c in have if c in want]))
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
                sql.Identifier(target, table), names, names, sql.Identifier(source, table)
            )
        )
    # the ids go on where the source's left off (of the tables the version has: a later one's
    # sequence has nothing to carry over, its table starts empty when the upgrade makes it)
    for (sequence,) in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_class t"
        "  JOIN pg_namespace tn ON tn.oid = t.relnamespace WHERE tn.nspname = %s AND t.relname = c.relname)",
        [source, target],
    ).fetchall():
        state = sql.SQL("SELECT last_value, is_called FROM {}").format(sql.Identifier(source, sequence))
        last, called = conn.execute(state).fetchone() or (None, None)
        name = sql.Identifier(target, sequence).as_string(conn)
        conn.execute("SELECT setval(%s::regclass, %s, %s)", [name, last, called])


def drain(engine: dex.Engine, clock: VirtualClock, jumps: int = 20) -> None:
    """``engine.drain()``, but a run whose task keeps failing (retried later, again and again)
    fails the test instead of keeping the clock jumping for ever."""
    for _ in range(jumps):
        engine.drain(advance_time=False)
        due = engine.store.next_due_time(clock.now())
        if due is None:
            return
        clock.advance_to(due)
    pytest.fail(f"work still due after {jumps} jumps of the clock: a task keeps failing")


@pytest.mark.parametrize("version", range(1, LATEST_VERSION))
def test_a_database_at_an_older_version_upgrades_with_its_runs_in_flight(
    in_flight: InFlight, pg_dsn: str, pg_schema: str, version: int
) -> None:
    """A schema at ``version``, holding runs in flight, upgrades to the newest; they complete.

    The engines of older versions are not importable here (only their migrations are kept), so
    the runs are put in flight by today's engine, stopped at every stage (new, a workflow task
    claimed by a node that died, an activity task due, a timer, a message waiting), and their
    rows are copied into a schema at ``version`` in the shape that version's tables have: the
    history one row per event before migration 5 (the block's events byte for byte, as
    migration 5 found them), no ``trace_context`` before 2; the foreign keys of versions 1 and
    2 hold, as every run's rows are there. Every other column is the same at every version.
    What the events' bytes held in older releases is the golden histories' concern, not this.
    """
    with psycopg.connect(pg_dsn) as conn:
        assert migrate(conn, pg_schema, version=version) == version
        with conn.transaction():
            copy_in_flight(conn, in_flight.schema, pg_schema, version)
        assert migrate(conn, pg_schema) == LATEST_VERSION
        # the upgraded schema is the one the migrations make from nothing
        assert describe_schema(conn, pg_schema) == describe_schema(conn, in_flight.schema)
    clock = VirtualClock(in_flight.now)
    adapter = PostgresAdapter(pg_dsn, schema=pg_schema, clock=clock, migrate=False)
    try:
        engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        drain(engine, clock)  # the dead node's lease ends, the timers fire: each run waits for its note
        runs = in_flight.runs
        assert {name: engine.get_run(run).status for name, run in runs.items()} == {
            name: (dex.RunStatus.RUNNING if name != "noted" else dex.RunStatus.COMPLETED) for name in runs
        }
        for name, run in runs.items():
            if name != "noted":
                engine.send_event(run, "note", name)
        drain(engine, clock)
        results = {name: (engine.get_run(run).status, engine.wait(run, timeout=0)) for name, run in runs.items()}
    finally:
        adapter.close()
    x = {"noted": 1, "sleeping": 2, "claimed by a dead node": 3, "activity due": 4, "new": 5}
    assert results == {
        name: (dex.RunStatus.COMPLETED, [2 * x[name], "early" if name == "noted" else name, 4 * x[name]])
        for name in runs
    }


def test_migration_19_keeps_each_slots_last_start_in_its_share(pg_dsn: str, pg_schema: str) -> None:
    """The start slots of migration 15 become shares (slot ``i`` in share ``i % shares``), each
    recent last start kept as a pair of its slot's share: the upgrade lets no burst through."""
    s = sql.Identifier(pg_schema)
    with psycopg.connect(pg_dsn) as conn:
        assert migrate(conn, pg_schema, version=18) == 18
        at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.queues (kind, name, capacity, rate_count, rate_period_us)"
                " VALUES ('activity', 'api', 10, 200, 1000000)"
            ).format(s=s)
        )
        stamps = {**dict.fromkeys(range(6), at), 7: at - timedelta(seconds=1)}
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.queue_starts (kind, queue, slot, last_start)"
                " SELECT 'activity', 'api', n, coalesce((%s::jsonb ->> n::text)::timestamptz, '-infinity')"
                " FROM generate_series(0, 199) AS n"
            ).format(s=s),
            [json.dumps({str(slot): moment.isoformat() for slot, moment in stamps.items()})],
        )
        conn.commit()
        assert migrate(conn, pg_schema) == LATEST_VERSION
        rows = conn.execute(
            sql.SQL(
                "SELECT share, slots, recent, counts, free_at = '-infinity' FROM {s}.queue_start_shares"
                " WHERE kind = 'activity' AND queue = 'api' ORDER BY share"
            ).format(s=s)
        ).fetchall()
    # 200 slots, 3 shares: slots 0 and 3 in share 0, 1, 4 and 7 in share 1, 2 and 5 in share 2
    assert rows == [
        (0, 67, [at], [2], True),
        (1, 67, [at - timedelta(seconds=1), at], [1, 2], True),
        (2, 66, [at], [2], True),
    ]
