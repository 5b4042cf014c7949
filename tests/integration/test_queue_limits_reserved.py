"""Starts reserved ahead on PostgreSQL (dex/adapters/postgres/rate_limits.py, the rule in
dex/domain/queue_limits.py): two adapters on one schema, one virtual clock, claim one task at a
time in turn from a queue whose limit is far above a claim's batch, so that each reserves
starts ahead and claims through them. What must hold, from the claims' times: no window of the
period holds more than the limit's count of starts, whichever engine made them; the limit is
reached (a full period's worth of starts in the first period); starts were reserved ahead (a
share held a stamp later than the clock while the claims ran)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from dex.adapters.postgres import PostgresAdapter
from dex.domain.queue_limits import RateLimit, reservation
from dex.testing import VirtualClock
from tests.contract.ports.support import LEASE, QUEUE, WF, start
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres

PERIOD = timedelta(seconds=10)
LIMIT = RateLimit(256, PERIOD)
STEP = timedelta(milliseconds=20)


@pytest.fixture
def engines() -> Iterator[tuple[str, str, list[PostgresAdapter], VirtualClock]]:
    dsn = postgres_dsn()
    clock = VirtualClock()
    with fresh_schema(dsn) as schema:
        adapters = [PostgresAdapter(dsn, schema=schema, clock=clock, max_connections=2) for _ in range(2)]
        try:
            yield dsn, schema, adapters, clock
        finally:
            for adapter in adapters:
                adapter.close()


def most_in_a_window(moments: list[datetime], period: timedelta) -> int:
    moments = sorted(moments)
    most, first = 0, 0
    for last, moment in enumerate(moments):
        while moment - moments[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_starts_reserved_ahead_by_two_engines_keep_the_limit(
    engines: tuple[str, str, list[PostgresAdapter], VirtualClock],
) -> None:
    dsn, schema, (a, b), clock = engines
    assert reservation(LIMIT, 1) is not None  # the limit is far enough above a batch of one
    a.create_queue(QUEUE, "workflow", 1000, 1, LIMIT)
    for n in range(700):
        start(a, clock, f"r{n}")
    assert a.schedule_workflow_tasks(clock.now(), 1000) == 700
    began, starts, ahead = clock.now(), [], False
    with psycopg.connect(dsn, autocommit=True) as conn:
        latest = sql.SQL("SELECT max(r) FROM {s}.queue_start_shares, unnest(recent) AS r").format(
            s=sql.Identifier(schema)
        )
        for n in range(1300):  # 26 s of claims, one engine after the other
            adapter = (a, b)[n % 2]
            for _task in adapter.claim_workflow_tasks(frozenset({WF}), f"w{n % 2}", clock.now(), LEASE, 1):
                starts.append(clock.now())
            stamp = conn.execute(latest).fetchone()
            ahead = ahead or (stamp is not None and stamp[0] is not None and stamp[0] > clock.now())
            clock.advance(STEP)
    assert most_in_a_window(starts, PERIOD) <= LIMIT.starts
    assert sum(1 for moment in starts if moment < began + PERIOD) == LIMIT.starts
    assert ahead


def test_a_limit_changed_by_another_engine_stops_the_starts_reserved_under_the_old_one(
    engines: tuple[str, str, list[PostgresAdapter], VirtualClock],
) -> None:
    """The reserving engine still reads the old limit (it reads the queues once a second), but
    its claim names the limit each reservation was made under: lowered elsewhere to what has
    already started, the queue starts nothing more in that period."""
    _dsn, _schema, (a, b), clock = engines
    a.create_queue(QUEUE, "workflow", 1000, 1, LIMIT)
    for n in range(20):
        start(a, clock, f"r{n}")
    a.schedule_workflow_tasks(clock.now(), 100)
    began = clock.now()
    started = sum(len(a.claim_workflow_tasks(frozenset({WF}), "a", clock.now(), LEASE, 1)) for _ in range(6))
    assert started == 6  # through starts reserved ahead, some left
    b.set_queue_rate_limit(QUEUE, "workflow", RateLimit(6, PERIOD))
    clock.advance(STEP)
    assert a.claim_workflow_tasks(frozenset({WF}), "a", clock.now(), LEASE, 1) == []
    assert b.claim_workflow_tasks(frozenset({WF}), "b", clock.now(), LEASE, 1) == []
    clock.advance(began + PERIOD / 2 - clock.now())
    assert a.claim_workflow_tasks(frozenset({WF}), "a", clock.now(), LEASE, 1) == []
