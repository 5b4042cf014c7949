"""Transaction steps run in groups inside their workflow tasks (dex.app.workflows.step_groups), on a
started engine, on both adapters: the steps' writes commit exactly once, a step that fails in a
group fails alone (retried as a task of its own). A group the store fails: see
``test_transaction_store_failures``.

The workflows, steps and ledger are those of ``test_transaction_steps``; each test makes its
own engine over the fixture's adapter with a generous inline limit, so that a loaded machine
does not send the steps the ordinary way (what these tests are not about).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest

import dex
from dex.app.ports.transactions import CheckpointOutcome, StepCheckpoint
from tests.contract import test_transaction_steps as steps
from tests.contract.test_transaction_steps import ACTIVITIES, LEDGER, WORKFLOWS, Env, _completed, three_steps

env = steps.env  # the fixture: both adapters, and the ledger the steps write to


class Groups:
    """Spies on the store's ``checkpoint_steps``: the size of every group; ``failures`` calls fail."""

    def __init__(self, store: Any, failures: int = 0, raising: BaseException | None = None) -> None:
        self.sizes: list[int] = []
        self.failures = failures
        self.raising = raising if raising is not None else ConnectionError("the store went away mid-group")
        real = store.checkpoint_steps

        def spy(items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
            self.sizes.append(len(items))
            if self.failures:
                self.failures -= 1
                raise self.raising
            return real(items, now)  # type: ignore[no-any-return]

        store.checkpoint_steps = spy


def _engine(env: Env) -> dex.Engine:
    return dex.Engine(env.engine.store, WORKFLOWS, ACTIVITIES, inline_activity_seconds=0.5)


def _warm(engine: dex.Engine) -> str:
    """A first run: a step's first attempt in a process takes the ordinary path (its duration
    becomes known there), so the runs after it may group."""
    run_id = engine.start_workflow(three_steps, "warm")
    assert len(engine.wait(run_id, timeout=30)) == 3
    return run_id


def _outcome(engine: dex.Engine, run_id: str) -> Any:
    try:
        return engine.wait(run_id, timeout=30)
    except dex.WorkflowFailedError as exc:
        return exc


def test_a_started_engine_runs_steps_in_groups_and_each_commits_once(env: Env) -> None:
    groups = Groups(env.engine.store)
    engine = _engine(env)
    engine.start()
    try:
        warm = _warm(engine)
        runs = [engine.start_workflow(three_steps, f"g{n}") for n in range(8)]
        for run_id in runs:
            assert engine.wait(run_id, timeout=30) == [f"g{runs.index(run_id)}-{k} recorded" for k in range(3)]
    finally:
        engine.stop(timeout=10)
    assert sum(groups.sizes) >= 8  # after the warm-up, first attempts went through groups
    rows = env.rows()
    assert sorted(rows) == sorted(
        [(warm, f"warm-{k}") for k in range(3)] + [(r, f"g{n}-{k}") for n, r in enumerate(runs) for k in range(3)]
    )
    for run_id in runs:  # the same history as a step run as a task of its own
        assert _completed(engine, run_id) == ["ActivityTaskCreated", "ActivityTaskCompleted"] * 3


@pytest.mark.parametrize("how", ["raise", "interrupt", "unprintable"])
def test_a_step_failing_in_a_group_fails_alone_and_is_retried_as_a_task(env: Env, how: str) -> None:
    groups = Groups(env.engine.store)
    engine = _engine(env)
    engine.start()
    try:
        _warm(engine)
        LEDGER.plan["bad-0"] = [how]
        bad = engine.start_workflow(three_steps, "bad")
        healthy = [engine.start_workflow(three_steps, f"ok{n}") for n in range(4)]
        for run_id in healthy:
            assert len(engine.wait(run_id, timeout=30)) == 3
    finally:
        engine.stop(timeout=10)
    engine.drain()  # the retry waits out its backoff on the virtual clock
    assert _outcome(engine, bad) == [f"bad-{k} recorded" for k in range(3)]
    assert LEDGER.attempts["bad-0"] >= 2  # the failed attempt, then its retry
    assert groups.sizes
    rows = env.rows()
    assert sorted(step for run, step in rows if run == bad) == [f"bad-{k}" for k in range(3)]  # rolled back once
    for run_id in healthy:
        assert len([row for row in rows if row[0] == run_id]) == 3


def test_args_with_nul_fail_only_their_own_run_in_a_group(env: Env) -> None:
    engine = _engine(env)
    engine.start()
    try:
        _warm(engine)
        bad = engine.start_workflow(three_steps, "nul\x00here")
        healthy = [engine.start_workflow(three_steps, f"fine{n}") for n in range(3)]
        for run_id in healthy:
            assert len(engine.wait(run_id, timeout=30)) == 3
    finally:
        engine.stop(timeout=10)
    engine.drain()
    # SQLite stores the NUL; PostgreSQL refuses it (a failed attempt, retried, then the run fails)
    assert isinstance(_outcome(engine, bad), (list, dex.WorkflowFailedError))
    rows = env.rows()
    for run_id in healthy:
        assert len([row for row in rows if row[0] == run_id]) == 3
