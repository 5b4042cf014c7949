"""Store errors in the deterministic simulation (docs/reference/contract.md §8).

``store-errors`` makes a node's next few store calls raise ConnectionError; ``store-flaky``
makes about a third of its next thirty fail, so that a task's load may work and a later call
of the same task (an inline activity's look at its queue, the give-back) fail. Whatever call
they strike, every invariant must hold — in particular no run may end FAILED of a store error
(``machinery-never-fails-a-run``): the task fails, is given back and retried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.app.ports.store import Lease
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo
from dex.simulation import FAULT_KINDS, Fault, Simulator
from dex.simulation.invariants import InvariantViolation
from dex.simulation.ledgers import LeaseLedger
from dex.simulation.referee import RunLog
from tests.simulation.test_simulation import STEPS, explore, seeds, simulate

STORE_FAULTS = ("store-errors", "store-flaky")

# store faults at many steps, other faults among them now and then
store_fault_schedules = st.lists(
    st.builds(Fault, st.integers(0, STEPS - 1), st.sampled_from(STORE_FAULTS), st.integers(0, 7)),
    min_size=4,
    max_size=20,
) | st.lists(
    st.builds(Fault, st.integers(0, STEPS - 1), st.sampled_from(sorted(FAULT_KINDS)), st.integers(0, 7)),
    min_size=4,
    max_size=20,
).map(lambda faults: faults + [Fault(f.at_step, "store-flaky", f.pick) for f in faults])


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)  # every given-back task logs a warning
    yield
    logging.disable(logging.NOTSET)


@explore(150)
@given(seeds, store_fault_schedules)
def test_store_errors_fail_no_run(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults)


@explore(150)
@given(seeds, store_fault_schedules)
def test_store_errors_fail_no_run_with_inline_activities(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, inline=True)


@pytest.mark.slow
@explore(3000)
@given(seeds, store_fault_schedules)
def test_store_errors_fail_no_run_many(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, inline=seed % 2 == 0)


def flaky_everywhere(seed: int) -> list[Fault]:
    return [Fault(5 + 20 * i, STORE_FAULTS[i % 2], (seed + i) % 8) for i in range(STEPS // 20)]


def test_store_errors_strike_every_kind_of_step_and_tasks_are_given_back() -> None:
    """Not vacuous: the faults hit claims, loads, flushes, schedulers and inline activities'
    queue reads; workflow tasks are given back (retry_later) and taken again; runs still end."""
    failed_steps: set[str] = set()
    given_back = struck = 0
    outcomes: set[str] = set()
    for seed in range(10):
        simulator = Simulator(seed, flaky_everywhere(seed), steps=STEPS, inline=seed % 2 == 0)
        report = simulator.run()
        failed_steps.update(line.split()[3].rstrip(":") for line in report.trace if "the store is unavailable" in line)
        struck += sum(node.store.failed for node in simulator.nodes)
        outcomes.update(o.split(":")[1] for o in report.outcomes)
        given_back += report.counts.get("given back", 0)
    assert {"scheduler", "workflows", "activities", "flush-workflows", "flush-activities"} <= failed_steps, failed_steps
    assert struck > 100 and given_back > 0, (struck, given_back)
    assert {"COMPLETED"} <= outcomes and "RUNNING" not in outcomes


def test_a_run_failed_by_the_machinery_is_caught() -> None:
    """The invariant itself: a run whose failure is a store error is a violation."""
    simulator = Simulator(0, [], steps=50)
    simulator.run()
    run_id, log = next(iter(simulator.referee.runs.items()))
    record: Any = simulator.referee.statuses.last[run_id]
    failed = attrs.evolve(
        record,
        status=RunStatus.FAILED,
        failure=FailureInfo(type="ConnectionError", message="connection lost during list_queues"),
    )
    with pytest.raises(InvariantViolation, match="machinery-never-fails-a-run"):
        simulator.referee._check_failed_by_its_code(log, failed)
    assert isinstance(log, RunLog)


def test_the_lease_ledger_accepts_only_the_latest_claim_given_back() -> None:
    now = datetime(2024, 1, 1, tzinfo=UTC)
    ledger = LeaseLedger()
    first = Lease(owner="n1", until=now + timedelta(seconds=30), version=1)
    ledger.claimed("workflow", 7, "run", first, now)
    ledger.given_back("workflow", 7, first, True)  # released: another claim may come at once
    second = Lease(owner="n2", until=now + timedelta(seconds=30), version=2)
    ledger.claimed("workflow", 7, "run", second, now)
    with pytest.raises(InvariantViolation, match="no-two-live-leases"):
        ledger.given_back("workflow", 7, first, True)  # the store gave back a lease it had lost
