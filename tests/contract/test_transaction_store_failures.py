"""A store that fails during a transaction step spends none of the step's attempts (docs/reference/contract.md §8).

The step's function ran, then the store failed before the commit (a connection lost, a
``BaseException``, an exception that cannot be printed): everything rolled back, and the step
runs again *as the same attempt*, so a step that allows one attempt still completes, with its
row written once. The same holds for a group of first attempts the store fails
(:mod:`dex.app.workflows.step_groups`): each step becomes a task of its own, still at attempt 1. Both
adapters; each test also completes a healthy run afterwards. Poisoned arguments and results
of grouped steps are here too: a lone surrogate is refused at the start, a result that cannot
be stored fails its own run only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import dex
from dex.app.activities.transaction_steps import STUCK_ROUNDS
from dex.app.ports.transactions import TransactionStep
from dex.domain.errors import SerializationError
from tests.contract import test_transaction_steps as steps
from tests.contract.test_step_groups import Groups, _outcome, _warm
from tests.contract.test_transaction_steps import LEDGER, Env, Unprintable, _insert, three_once, three_steps

env = steps.env  # the fixture: both adapters, and the ledger the steps write to


def _raise(kind: str) -> None:
    if kind == "connection":
        raise ConnectionError("the store went away mid-step")
    if kind == "interrupt":
        raise KeyboardInterrupt("in the store")
    raise Unprintable()


class StoreFailsAfterTheFunction:
    """Wraps the store's ``complete_in_transaction``: its first ``failures`` calls run the
    step's function in the transaction and then raise ``kind`` (not the step's failure: the
    store's), so the transaction rolls back with the function's writes in it."""

    def __init__(self, store: Any, kind: str, failures: int) -> None:
        self.failures, self.calls = failures, 0
        real: Callable[[TransactionStep], bool] = store.complete_in_transaction

        def flaky(step: TransactionStep) -> bool:
            self.calls += 1
            if not self.failures or step.work is None:
                return real(step)
            self.failures -= 1
            work = step.work

            def then_fail(conn: Any) -> Any:
                work(conn)
                _raise(kind)

            return real(attrs.evolve(step, work=then_fail))

        store.complete_in_transaction = flaky


@pytest.mark.parametrize("kind", ["connection", "interrupt", "unprintable"])
def test_a_store_failing_a_step_twice_spends_none_of_its_single_attempt(env: Env, kind: str) -> None:
    flaky = StoreFailsAfterTheFunction(env.engine.store, kind, failures=2)
    run_id = env.engine.start_workflow(three_once, "once")
    env.engine.drain()  # the step is given back after a backoff, which the virtual clock skips
    assert env.engine.wait(run_id, timeout=5) == [f"once-{n} recorded" for n in range(3)]
    assert flaky.failures == 0 and flaky.calls == 5
    assert LEDGER.seen["once-0"] == [1, 1, 1]  # three runs of the function, every one attempt 1
    assert env.rows() == [(run_id, f"once-{n}") for n in range(3)]  # the failed ones rolled back
    healthy = env.engine.start_workflow(three_steps, "healthy")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3


def test_a_store_failing_a_step_every_time_makes_drain_raise_naming_it(env: Env) -> None:
    flaky = StoreFailsAfterTheFunction(env.engine.store, "connection", failures=10**6)
    run_id = env.engine.start_workflow(three_once, "outage")
    with pytest.raises(RuntimeError, match="record-once") as raised:
        env.engine.drain()  # each backoff skipped by the virtual clock: it would go on forever
    assert run_id in str(raised.value) and "the store went away mid-step" in str(raised.value)
    assert STUCK_ROUNDS <= flaky.calls <= STUCK_ROUNDS + 1
    assert env.rows() == []  # every attempt rolled back
    flaky.failures = 0  # the store is back: the same attempt commits, and a healthy run too
    env.engine.drain()
    assert env.engine.wait(run_id, timeout=5) == [f"outage-{n} recorded" for n in range(3)]
    assert set(LEDGER.seen["outage-0"]) == {1}  # every run of its function was attempt 1: none spent
    healthy = env.engine.start_workflow(three_steps, "healthy")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3


def test_a_failure_of_the_step_itself_still_spends_its_attempt(env: Env) -> None:
    LEDGER.plan["spent-0"] = ["raise"]
    run_id = env.engine.start_workflow(three_once, "spent")
    env.engine.drain()
    with pytest.raises(dex.WorkflowFailedError, match="attempt 1 of spent-0 failed"):
        env.engine.wait(run_id, timeout=5)
    assert LEDGER.seen["spent-0"] == [1]
    assert env.rows() == []
    healthy = env.engine.start_workflow(three_once, "after")
    env.engine.drain()
    assert len(env.engine.wait(healthy, timeout=5)) == 3


def _grouping(env: Env) -> dex.Engine:
    return dex.Engine(env.engine.store, steps.WORKFLOWS, steps.ACTIVITIES, inline_activity_seconds=0.5)


def _warm_once(engine: dex.Engine) -> None:
    """As ``_warm``, for record-once: its first attempt in a process takes the ordinary path."""
    run_id = engine.start_workflow(three_once, "warm-once")
    assert len(engine.wait(run_id, timeout=30)) == 3


@pytest.mark.parametrize(
    "raising",
    [ConnectionError("the store went away mid-group"), KeyboardInterrupt("in the store"), Unprintable()],
    ids=["connection", "interrupt", "unprintable"],
)
def test_the_store_failing_a_group_gives_each_step_back_at_its_first_attempt(env: Env, raising: BaseException) -> None:
    groups = Groups(env.engine.store, raising=raising)
    engine = _grouping(env)
    engine.start()
    try:
        _warm_once(engine)
        groups.failures = 1
        runs = [engine.start_workflow(three_once, f"g{n}") for n in range(4)]
        deadline = time.monotonic() + 30
        while groups.failures and time.monotonic() < deadline:
            time.sleep(0.01)
        healthy = engine.start_workflow(three_steps, "later")
        assert len(engine.wait(healthy, timeout=30)) == 3
        for n, run_id in enumerate(runs):  # one attempt each allowed: none was spent by the store
            assert engine.wait(run_id, timeout=30) == [f"g{n}-{k} recorded" for k in range(3)]
    finally:
        engine.stop(timeout=10)
    assert groups.failures == 0  # a group was failed by the store
    assert all(seen == [1] * len(seen) for seen in LEDGER.seen.values())
    rows = env.rows()
    for run_id in [*runs, healthy]:
        assert len([row for row in rows if row[0] == run_id]) == 3  # each step committed once


@dex.transaction(name="surrogate-result", retry=steps.FAST)
def surrogate_result(conn: Any, run_id: str) -> str:
    _insert(conn, run_id, "surrogate")
    return "half a pair: \ud800"


@dex.workflow(name="surrogate")
async def surrogate(ctx: dex.WorkflowContext) -> str:
    result: str = await ctx.activity(surrogate_result, ctx.run_id)
    return result


def test_lone_surrogates_in_grouped_steps_fail_only_their_own_call_or_run(env: Env) -> None:
    engine = dex.Engine(
        env.engine.store,
        [*steps.WORKFLOWS, surrogate],
        [*steps.ACTIVITIES, surrogate_result],
        inline_activity_seconds=0.5,
    )
    engine.start()
    try:
        _warm(engine)
        with pytest.raises(SerializationError, match="not valid Unicode"):
            engine.start_workflow(three_steps, "sur\ud800rogate")  # refused at the call: nothing started
        first = engine.start_workflow(surrogate)  # its first attempt: the ordinary path
        bad = engine.start_workflow(surrogate)  # a group's, once the first's duration is known
        healthy = [engine.start_workflow(three_steps, f"fine{n}") for n in range(3)]
        for run_id in healthy:
            assert len(engine.wait(run_id, timeout=30)) == 3
        for run_id in (first, bad):
            outcome = _outcome(engine, run_id)
            assert isinstance(outcome, dex.WorkflowFailedError)
            assert "Unicode" in str(outcome) + str(outcome.__cause__)
    finally:
        engine.stop(timeout=10)
    rows = env.rows()
    assert not [row for row in rows if row[0] in (first, bad)]  # their inserts rolled back
    for run_id in healthy:
        assert len([row for row in rows if row[0] == run_id]) == 3
