"""A run started in the application's transaction with a deadline (docs/reference/contract.md §9,
§14): the run, its deadline and the cancel request that waits for it commit or roll back
together."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.testing import VirtualClock
from tests.contract.test_run_endings import waiter

pytestmark = pytest.mark.postgres


def test_a_deadline_commits_and_rolls_back_with_its_run(
    make_adapter: Callable[..., PostgresAdapter], pg_dsn: str, clock: VirtualClock
) -> None:
    engine = dex.Engine(make_adapter(), workflows=[waiter])
    with psycopg.connect(pg_dsn) as conn:
        gone = engine.start_workflow(waiter, connection=conn, timeout=timedelta(minutes=1))
        conn.rollback()
    with pytest.raises(dex.RunNotFoundError):
        engine.get_run(gone)
    with psycopg.connect(pg_dsn) as conn:
        run_id = engine.start_workflow(waiter, connection=conn, timeout=timedelta(minutes=1))
        conn.commit()
    info = engine.get_run(run_id)
    assert info.deadline == info.created_at + timedelta(minutes=1)
    engine.drain(advance_time=False)
    clock.advance(timedelta(minutes=2))
    engine.drain(advance_time=False)
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.CANCELLED
    assert info.failure is not None and info.failure.message == "the run was cancelled: timeout"
    engine.stop(timeout=5)
