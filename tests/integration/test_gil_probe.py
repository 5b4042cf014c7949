"""The benchmark probe ``benchmarks.io_bound --starts-keep-the-gil`` on a real PostgreSQL: with
the start's statement waiting for its answer holding the GIL, starts still write their runs,
the runs complete, and an error of the statement is still psycopg's exception."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import dex
from benchmarks.io_bound import keep_the_gil_while_starting
from dex.adapters.postgres import PostgresAdapter, direct

pytestmark = pytest.mark.postgres


@dex.activity(name="probe-inc")
def inc(x: int) -> int:
    return x + 1


@dex.workflow(name="probe-one")
async def one(ctx: dex.WorkflowContext, x: int) -> int:
    result: int = await ctx.activity(inc, x)
    return result


def test_starts_that_keep_the_gil_still_write_their_runs(
    make_adapter: Callable[..., PostgresAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct.DirectStatement, "execute", direct.DirectStatement.execute)  # restored after
    keep_the_gil_while_starting()
    adapter = make_adapter()
    engine = dex.Engine(adapter, [one], [inc])
    run_ids = [engine.start_workflow(one, i) for i in range(5)]
    engine.drain()
    assert [engine.wait(run_id, timeout=5) for run_id in run_ids] == [1, 2, 3, 4, 5]
    failing = direct.DirectStatement("dex_probe_fails", b"SELECT 1 / $1", [direct.INT4])
    with adapter.reading() as conn, pytest.raises(psycopg.errors.DivisionByZero):
        failing.execute(conn, [b"0"])


def test_the_engine_alone_part_times_its_loop_of_starts_with_no_engine_running() -> None:
    """``benchmarks.run``'s throughput part reports the starts' own rate (the ceiling of any
    in-process batch of sequential starts) beside the engine's: both from the runs it made."""
    from benchmarks.dex_bench import engine_alone
    from tests.pg import postgres_dsn

    measured = engine_alone(postgres_dsn(), 30, timeout=60)
    assert measured["done"] == 30
    assert measured["starts_rate"] > 0
    # the loop of starts ran before the engine did, so its runs were all there to be done
    assert measured["seconds"] > 0 and measured["rate"] == pytest.approx(30 / measured["seconds"])
