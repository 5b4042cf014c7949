"""Deterministic simulation of a dex cluster.

Hypothesis draws seeds and fault schedules; ``Simulator(seed, faults).run()`` drives three
nodes over one in-memory store, injects the faults and checks every invariant after every
step and at the end (see ``dex/simulation``). Hypothesis shrinks a failure to a minimal
schedule, and the failure names the call that replays it exactly.

The default run explores a few hundred schedules; ``-m slow`` explores many thousands. The
bugs the simulator found stay covered by ``test_regressions.py``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivityTask
from dex.domain import events as ev
from dex.domain.errors import RunNotFoundError
from dex.simulation import FAULT_KINDS, Fault, ObservedAdapter, SimulationFailure, Simulator
from dex.simulation.chain_workload import CHAIN_WORKLOAD
from dex.simulation.conversation_workload import CONVERSATION_WORKLOAD

STEPS = 400

fault_schedules = st.lists(
    st.builds(Fault, st.integers(0, STEPS - 1), st.sampled_from(sorted(FAULT_KINDS)), st.integers(0, 7)),
    max_size=16,
)
seeds = st.integers(0, 2**32 - 1)
SIMULATION = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def explore(examples: int) -> settings:
    return settings(SIMULATION, max_examples=examples)


def simulate(seed: int, faults: list[Fault], **options: Any) -> None:
    simulator = Simulator(seed, faults, steps=STEPS, **options)
    note(f"replay with: {simulator.reproduction()}")
    report = simulator.run()
    for outcome in report.outcomes:
        event(outcome)
    if report.counts.get("discarded"):
        event("some results were discarded")


@explore(400)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults)


# the same with the executor cache off: every task replays its run's history from the start
UNCACHED: dict[str, Any] = {"engine_options": {"executor_cache_size": 0}}


@explore(150)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_without_the_executor_cache(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **UNCACHED)


# the same with inline activities: first attempts run inside the workflow tasks that schedule
# them, and a crash or a lost lease between the attempt and the task's write redoes both
INLINE: dict[str, Any] = {"inline": True}


@explore(150)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_with_inline_activities(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **INLINE)


@pytest.mark.slow
@explore(2000)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_with_inline_activities_many(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **INLINE)


# the same with chained activities: each run's first activity a task, the steps answered after
# it chaining the next ones in the attempt's thread; a crash, a lost claim or a declined write
# between a chained attempt and the step's write redoes them
CHAINED: dict[str, Any] = {"chained": True, "workload": CHAIN_WORKLOAD}


@explore(150)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_with_chained_activities(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **CHAINED)


@pytest.mark.slow
@explore(2000)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_with_chained_activities_many(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **CHAINED)


@pytest.mark.slow
@explore(5000)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_many(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults)


@pytest.mark.slow
@explore(2000)
@given(seeds, fault_schedules)
def test_every_schedule_keeps_the_invariants_without_the_executor_cache_many(seed: int, faults: list[Fault]) -> None:
    simulate(seed, faults, **UNCACHED)


# -- the simulation does what it says ------------------------------------------------------------

EVERY_FAULT = [Fault(10 + 20 * i, kind, i) for i, kind in enumerate(sorted(FAULT_KINDS))]


def test_every_fault_kind_strikes_and_the_runs_still_end() -> None:
    report = Simulator(3, EVERY_FAULT, steps=STEPS).run()
    struck = [line for line in report.trace if " fault  " in line]
    assert [line.split()[3].rstrip(":") for line in struck] == sorted(FAULT_KINDS)
    assert report.outcomes and all(":RUNNING" not in o and ":CREATED" not in o for o in report.outcomes)


def test_the_simulations_reach_every_outcome_and_lose_work_to_faults() -> None:
    """Not vacuous: across a few seeds, runs complete, fail and are cancelled, results are
    discarded, duplicates are refused, and nodes die and join."""
    outcomes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    trace: list[str] = []
    for seed in range(12):
        report = Simulator(seed, EVERY_FAULT).run()
        outcomes.update(o.split(":")[1] for o in report.outcomes)
        counts.update(report.counts)
        trace += report.trace
    assert {"COMPLETED", "FAILED", "CANCELLED"} <= set(outcomes)
    assert counts["discarded"] > 0 and counts["redelivered"] > 0 and counts["applied"] > 100
    text = "\n".join(trace)
    for what in ("joins", "takes over", "hangs", "-> retry", "client suspend", "client resume", "leads"):
        assert what in text, what
    # answered steps (dex.app.workflows.answers), under faults: written with their outcome, and declined
    # (the run moved on, a message came first, the claim was lost) so the outcome went the ordinary way
    assert counts["answered"] > 0 and counts["answers declined"] > 0, counts


def test_the_inline_simulations_run_activities_inside_workflow_tasks() -> None:
    """Not vacuous: with ``inline``, more activity outcomes reach histories than activity tasks
    were ever claimed (the rest ran inline), with and without faults."""
    for faults in ([], EVERY_FAULT):
        claimed = answered = 0
        for seed in range(3):
            simulator = Simulator(seed, faults, inline=True)
            simulator.run()
            claimed += sum(1 for kind, _task in simulator.referee.leases._claims if kind == "activity")
            answered += sum(
                1
                for log in simulator.referee.runs.values()
                for history in log.all_generations()
                for item in history
                if isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed))
            )
        assert answered > claimed, (len(faults), answered, claimed)


def test_the_chained_simulations_chain_activities_in_answered_steps() -> None:
    """Not vacuous: with ``chained``, runs record more activity outcomes than activity tasks were
    ever claimed for them (the rest ran chained in answered steps: nothing runs in the workflow
    threads), with and without faults."""
    for faults in ([], EVERY_FAULT):
        chained = 0
        for seed in range(8):  # (under faults most seeds redo their chains as tasks)
            simulator = Simulator(seed, faults, chained=True, workload=CHAIN_WORKLOAD)
            simulator.run()
            tasks: dict[str, int] = {}  # run id -> activity tasks ever claimed for it
            for (kind, _task_id), claim in simulator.referee.leases._claims.items():
                if kind == "activity":
                    tasks[claim.run_id] = tasks.get(claim.run_id, 0) + 1
            for run_id, log in simulator.referee.runs.items():
                outcomes = sum(
                    1
                    for history in log.all_generations()
                    for item in history
                    if isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed))
                )
                chained += max(0, outcomes - tasks.get(run_id, 0))  # steps that had no task
        assert chained > 0, len(faults)


def fingerprint(simulator: Simulator) -> str:
    """The trace and every history written, as one digest."""
    digest = hashlib.sha256("\n".join(simulator.trace).encode())
    for run_id, log in sorted(simulator.referee.runs.items()):
        for history in log.all_generations():
            digest.update(f"{run_id}{[(e.sequence_number, e.timestamp, e.event) for e in history]}".encode())
    return digest.hexdigest()


@pytest.mark.parametrize(
    "options", [{}, CHAINED, {"workload": CONVERSATION_WORKLOAD}], ids=["plain", "chained", "conversations"]
)
def test_the_same_seed_and_faults_give_the_same_trace_and_histories(options: dict[str, Any]) -> None:
    faults = [Fault(40, "crash-after-execute", 1), Fault(90, "lease-expiry", 0), Fault(120, "duplicate", 3)]
    first, second = Simulator(11, faults, **options), Simulator(11, faults, **options)
    first.run()
    second.run()
    assert first.trace == second.trace
    assert fingerprint(first) == fingerprint(second)
    other = Simulator(12, faults, **options)
    other.run()
    assert other.trace != first.trace


REPLAY_SCRIPT = """
import logging, sys
logging.disable(logging.CRITICAL)
from dex.simulation import Fault, Simulator
from tests.simulation.test_simulation import fingerprint
simulator = Simulator(11, [Fault(40, "crash-after-execute", 1), Fault(90, "lease-expiry", 0)])
simulator.run()
print(fingerprint(simulator))
"""


def test_a_seed_replays_exactly_in_another_process() -> None:
    """Nothing depends on hash randomisation, wall time or process state."""
    root = Path(__file__).resolve().parents[2]
    digests = set()
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
        out = subprocess.run(
            [sys.executable, "-c", REPLAY_SCRIPT], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        digests.add(out.stdout.strip())
    here = Simulator(11, [Fault(40, "crash-after-execute", 1), Fault(90, "lease-expiry", 0)])
    here.run()
    digests.add(fingerprint(here))
    assert len(digests) == 1


# -- broken stores are caught ----------------------------------------------------------------------
# Each store below breaks one promise; the simulator must notice, name the invariant, and say
# how to replay the failure. (The observing adapter sits above the broken one: it reports what
# the broken store really did.)


class LeaseBlindStore(InMemoryAdapter):
    """Hands out activity tasks whose leases are still held."""

    def claim_activity_tasks(self, names: Any, owner: str, now: Any, lease: Any, limit: int) -> list[ActivityTask]:
        return super().claim_activity_tasks(names, owner, now + timedelta(minutes=10), lease, limit)


class EarlyTimerStore(InMemoryAdapter):
    """Shows workflow tasks messages ten seconds before they are due."""

    def schedule_workflow_tasks(self, now: Any, limit: int) -> int:
        return super().schedule_workflow_tasks(now + timedelta(seconds=10), limit)

    def load_workflow_task(self, task: Any, now: Any, after_seq: int = 0) -> Any:
        return super().load_workflow_task(task, now + timedelta(seconds=10), after_seq)


class StaleCompletionStore(InMemoryAdapter):
    """Applies activity outcomes whatever became of their lease (under the lease the task holds now)."""

    def complete_activity_tasks(self, outcomes: Any, now: Any) -> list[bool]:
        current = self.find_activity_tasks([outcome.task.task_id for outcome in outcomes])
        forced = [
            attrs.evolve(outcome, task=task) if task is not None else outcome
            for outcome, task in zip(outcomes, current, strict=True)
        ]
        return super().complete_activity_tasks(forced, now)


class ForgetfulInboxStore(InMemoryAdapter):
    """Leaves activity results in the inbox after a workflow task consumed them."""

    def complete_workflow_tasks(self, results: Any, now: Any) -> list[bool]:
        forgetful = []
        for task, result in results:
            messages = {m.message_id: m.event for m in self._inbox(task, now)}
            kept = tuple(i for i in result.consumed if not isinstance(messages.get(i), ev.ActivityTaskCompleted))
            forgetful.append((task, attrs.evolve(result, consumed=kept)))
        return super().complete_workflow_tasks(forgetful, now)

    def _inbox(self, task: Any, now: Any) -> list[Any]:
        try:
            return self.load_workflow_task(task, now)[1]
        except RunNotFoundError:
            return []


class GreedyLeaderStore(InMemoryAdapter):
    """Lets every node lead."""

    def try_lead(self, node_id: str, now: Any, ttl: timedelta) -> bool:
        super().try_lead(node_id, now, ttl)
        return True


class EagerRetentionStore(InMemoryAdapter):
    """Deletes runs the moment they end."""

    def delete_finished_runs(self, completed_before: Any, limit: int) -> int:
        return super().delete_finished_runs(completed_before + timedelta(days=1), limit)


class LostResultStore(InMemoryAdapter):
    """Drops every third activity result on the floor (acknowledged, never delivered): the task
    is put back to wait a century instead, a moment the store never reports as due."""

    dropped = 0
    LOST = timedelta(days=36500)

    def complete_activity_tasks(self, outcomes: Any, now: Any) -> list[bool]:
        kept = []
        for outcome in outcomes:
            if outcome.retry_at is None and outcome.result is not None:
                self.dropped += 1
                if self.dropped % 3 == 0:
                    outcome = attrs.evolve(outcome, retry_at=now + self.LOST, result=None)
            kept.append(outcome)
        return super().complete_activity_tasks(kept, now)

    def next_due_time(self, now: Any) -> Any:
        due = super().next_due_time(now)
        return None if due is not None and due - now > self.LOST / 2 else due


def observed(broken: type[InMemoryAdapter]) -> type[ObservedAdapter]:
    return type(broken.__name__.replace("Store", "Adapter"), (ObservedAdapter, broken), {})


BROKEN_STORES = [
    (LeaseBlindStore, "no-two-live-leases"),
    (EarlyTimerStore, "timers-not-early"),
    (StaleCompletionStore, "no-two-live-leases"),
    (ForgetfulInboxStore, "outcomes-once"),
    (GreedyLeaderStore, "one-leader"),
    (EagerRetentionStore, "retention"),
    (LostResultStore, "every-run-ends"),
]


@pytest.mark.parametrize(("broken", "invariant"), BROKEN_STORES, ids=[b.__name__ for b, _ in BROKEN_STORES])
def test_a_broken_store_is_caught_naming_the_invariant(broken: type[InMemoryAdapter], invariant: str) -> None:
    adapter_class = observed(broken)
    for seed in range(20):
        simulator = Simulator(seed, [Fault(60, "lease-expiry", 0), Fault(150, "crash", 1)], adapter_class=adapter_class)
        try:
            simulator.run()
        except SimulationFailure as failure:
            assert getattr(failure.cause, "invariant", None) == invariant, failure
            assert simulator.reproduction() in str(failure)
            assert f"Simulator(seed={seed}, faults=[Fault(60, 'lease-expiry', 0), Fault(150, 'crash', 1)]" in str(
                failure
            )
            return
    pytest.fail(f"{broken.__name__} went unnoticed for 20 seeds")


def test_a_failure_replays_exactly_from_what_it_prints() -> None:
    adapter_class = observed(LeaseBlindStore)
    namespace = {"Simulator": Simulator, "Fault": Fault, adapter_class.__name__: adapter_class}
    for seed in range(20):
        try:
            Simulator(seed, [Fault(30, "hang", 2)], adapter_class=adapter_class).run()
        except SimulationFailure as failure:
            with pytest.raises(SimulationFailure) as again:
                eval(failure.reproduction, namespace)
            assert str(again.value) == str(failure)
            return
    pytest.fail("the lease-blind store went unnoticed")


def test_the_simulated_nodes_run_the_started_engines_rounds_with_eager_dispatch_and_buffers() -> None:
    """Not vacuous: the nodes run the coordinator's rounds — completions claim activity and
    workflow tasks for their own node (eager dispatch), attempts wait in the pool, flushes
    write batches — under faults, with and without inline activities."""
    for inline in (False, True):
        dispatched = {"activity": 0, "workflow": 0}
        kinds: set[str] = set()
        for seed in range(4):
            simulator = Simulator(seed, EVERY_FAULT, inline=inline)
            report = simulator.run()
            dispatched = {k: v + sum(n.dispatched[k] for n in simulator.nodes) for k, v in dispatched.items()}
            kinds.update(line.split()[3].rstrip(":") for line in report.trace)
            # armed as a start arms an engine: a watchdog watches each node's workflow code (and,
            # on the virtual clock, never finds any running long)
            assert all(n.engine.runtime.watchdog is not None for n in simulator.nodes)
        assert dispatched["activity"] > 0 and dispatched["workflow"] > 0, (inline, dispatched)
        assert {"scheduler", "workflows", "activities", "flush-workflows", "flush-activities"} <= kinds
        assert "watchdog" not in kinds
        assert inline or "run-attempt" in kinds
