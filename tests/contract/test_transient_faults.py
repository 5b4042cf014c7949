"""Transient store errors never fail a run (docs/reference/contract.md §8), on every adapter.

A started engine (real threads, eager dispatch, inline activities on as by default) runs
hundreds of workflows — several activities, a timer, a child run and an external event each —
through a store of which 30 % of the calls fail (:class:`tests.faults.FaultyStore`: the
connection lost before or after the call, a timeout, a delay). Then the faults stop, and every
run must end COMPLETED with its right result: a failure of the machinery fails a task, which is
retried with backoff, never the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

import dex
import dex.app.workflows.held
from dex.adapters.memory import InMemoryAdapter
from tests.faults import FaultyStore

QUICK_RETRY = dex.RetryPolicy(
    initial_delay=timedelta(milliseconds=50),
    multiplier=2.0,
    max_delay=timedelta(seconds=1),
    max_attempts=1000,
)


@dex.activity(lock_timeout=timedelta(seconds=3), retry=QUICK_RETRY)
def fault_add(x: int, y: int) -> int:
    return x + y


@dex.workflow
async def fault_double(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(fault_add, x, x, retry=QUICK_RETRY)  # type: ignore[no-any-return]


@dex.workflow
async def fault_chain(ctx: dex.WorkflowContext, n: int) -> int:
    a: int = await ctx.activity(fault_add, n, 1, retry=QUICK_RETRY)
    b: int = await ctx.activity(fault_add, a, 2, retry=QUICK_RETRY)
    await ctx.sleep(0.05)
    c: int = await ctx.activity(fault_add, b, 3, retry=QUICK_RETRY)
    bonus: int = await ctx.wait_for_event("bonus")
    doubled: int = await ctx.child(fault_double, c + bonus)
    return doubled


def expected(n: int) -> int:
    return (n + 6 + 10) * 2


def retrying(call: Callable[[], Any], deadline: float) -> Any:
    """A caller that retries on a transient error (an injected fault may hit its own call)."""
    while True:
        try:
            return call()
        except (ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def real_adapter(kind: str) -> Iterator[Any]:
    """An adapter on the real clock (timers, leases and backoffs must run out by themselves)."""
    if kind == "memory":
        yield InMemoryAdapter()
        return
    from dex.adapters.postgres import PostgresAdapter
    from tests.pg import fresh_schema, postgres_dsn

    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=8)
        try:
            yield adapter
        finally:
            adapter.close()


def quick_task_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # a task given back after a machinery error waits 1 s doubling up to 5 min by default;
    # the test shortens that backoff as it shortens the leases, to end in its time
    monkeypatch.setattr(
        dex.app.workflows.held,
        "TASK_RETRY",
        dex.RetryPolicy(
            initial_delay=timedelta(milliseconds=100),
            multiplier=2.0,
            max_delay=timedelta(seconds=1),
            max_attempts=2**31 - 1,
        ),
    )


def drive(kind: str, runs: int, fault_seconds: float, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    quick_task_retries(monkeypatch)
    with real_adapter(kind) as adapter:
        store = FaultyStore(adapter, rate=0.3, seed=seed)
        engine = dex.Engine(
            store,  # type: ignore[arg-type]
            workflows=[fault_chain, fault_double],
            activities=[fault_add],
            poll_interval=0.02,
            workflow_task_lease=timedelta(seconds=2),
        )
        engine.start()
        try:
            store.enabled = True
            began = time.monotonic()
            deadline = began + fault_seconds + 120
            run_ids = []
            for n in range(runs):
                run_ids.append(
                    retrying(lambda n=n: engine.start_workflow(fault_chain, n, instance_id=f"chain-{n}"), deadline)
                )
                retrying(lambda n=n: engine.send_event(run_ids[n], "bonus", 10), deadline)
            started = time.monotonic()
            time.sleep(max(0.0, began + fault_seconds - started))  # the faults go on for a while
            store.enabled = False
            faults_off = time.monotonic() - began
            print(f"{kind}: {runs} runs started in {started - began:.1f} s, faults off after {faults_off:.1f} s")
            assert sum(store.injected.values()) > runs, store.injected  # the faults did strike
            assert store.injected["after"] and store.injected["before"] and store.injected["timeout"]
            results = {}
            for n, run_id in enumerate(run_ids):
                try:
                    results[n] = engine.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))
                except dex.WorkflowFailedError as exc:
                    results[n] = exc.failure
            wrong = {n: _short(got) for n, got in results.items() if got != expected(n)}
            assert not wrong, f"{len(wrong)} of {runs} runs went wrong, e.g. {list(wrong.items())[:3]}"
            statuses = {engine.get_run(run_id).status for run_id in run_ids}
            assert statuses == {dex.RunStatus.COMPLETED}
            print(f"{kind}: all {runs} runs completed {time.monotonic() - began:.1f} s after the faults began")
        finally:
            store.enabled = False
            engine.stop(timeout=10)


def _short(got: Any) -> Any:
    return (got.type, got.message) if isinstance(got, dex.FailureInfo) else got


ADAPTERS = ["memory", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", ADAPTERS)
def test_thirty_percent_store_faults_fail_no_run(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drive(kind, runs=200, fault_seconds=8, monkeypatch=monkeypatch, seed=19)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ADAPTERS)
def test_thirty_percent_store_faults_for_45_seconds_fail_none_of_1000_runs(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drive(kind, runs=1000, fault_seconds=45, monkeypatch=monkeypatch, seed=45)


@dex.activity(lock_timeout=timedelta(seconds=3), retry=QUICK_RETRY)
async def fault_add_awaited(x: int, y: int) -> int:
    await asyncio.sleep(0.001)
    return x + y


@dex.workflow
async def fault_awaited_chain(ctx: dex.WorkflowContext, n: int) -> int:
    a: int = await ctx.activity(fault_add_awaited, n, 1)
    b: int = await ctx.activity(fault_add_awaited, a, 2)
    return await ctx.activity(fault_add_awaited, b, 3)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ADAPTERS)
def test_store_faults_around_awaited_attempts_fail_no_run(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``async def`` activities awaited on the engine's loop (every one a task of its own): the
    store failing as their outcomes are written, and as the steps they answer are, fails no run;
    the attempts' slots come back (a healthy batch runs after at one attempt at a time)."""
    quick_task_retries(monkeypatch)
    with real_adapter(kind) as adapter:
        store = FaultyStore(adapter, rate=0.3, seed=7)
        engine = dex.Engine(
            store,  # type: ignore[arg-type]
            workflows=[fault_awaited_chain],
            activities=[fault_add_awaited],
            poll_interval=0.02,
            workflow_task_lease=timedelta(seconds=2),
            inline_activity_seconds=0,
            activity_concurrency=2,
        )
        engine.start()
        try:
            store.enabled = True
            deadline = time.monotonic() + 120
            run_ids = [
                retrying(
                    lambda n=n: engine.start_workflow(fault_awaited_chain, n, instance_id=f"awaited-{n}"), deadline
                )
                for n in range(60)
            ]
            # faults go on until the attempts' outcomes, and the steps they answer, have been
            # written a few times under them (at least 3 s; on a loaded host it takes longer)
            struck = time.monotonic() + 3
            while time.monotonic() < deadline - 60 and (
                time.monotonic() < struck
                or sum(n for name, n in dict(store.calls).items() if name.startswith("complete_")) <= 5
            ):
                time.sleep(0.1)
            store.enabled = False
            # the writes of the attempts' outcomes, and of the steps they answer, were struck
            assert sum(n for name, n in store.calls.items() if name.startswith("complete_")) > 5, store.calls
            results = [engine.wait(run_id, timeout=max(1.0, deadline - time.monotonic())) for run_id in run_ids]
            assert results == [n + 6 for n in range(60)]
            assert engine.wait(engine.start_workflow(fault_awaited_chain, 100), timeout=30) == 106
            assert engine.health().threads_alive, engine.health()
        finally:
            store.enabled = False
            engine.stop(timeout=10)
