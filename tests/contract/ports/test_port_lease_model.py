"""Activity-task leases against a model: a hypothesis state machine over claims, heartbeats,
outcomes, retries and the passing of time, run over each backend.

The model is what docs/reference/contract.md §6–§8 and the ActivityTaskQueue docstrings say, in a few lines: a task
is claimable when it is queued and nobody's lease on it runs; claims take the oldest first,
each under a lease of ``now + min(lease, lock_timeout)`` whose version is new; taking a task
over from a lease that ran out counts as its next attempt; a heartbeat or an outcome applies
only for the claim that holds the task now; a retry sends the task back, as its next attempt,
to be made claimable again from its retry time; a result settles it for good.

Each example works in a queue and under names of its own, so one store serves all the
examples of a test (a PostgreSQL schema is made once, not per example).
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, multiple, rule, run_state_machine_as_test

from dex.app.ports.store import ActivityOutcome, ActivityTask, Store
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    EPOCH,
    LOCK_TIMEOUT,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    created,
    decide,
    failure,
    payload,
)

SHORT = timedelta(seconds=10)
RETRY = timedelta(seconds=5)
TASKS = 4


@attrs.define
class Modelled:
    """What the model knows of one task."""

    queued: bool = True  # claimable once nobody holds it (else waiting for its retry time)
    visible_from: datetime = EPOCH
    holder: tuple[str, int] | None = None  # (owner, version) of the last claim
    until: datetime = EPOCH
    attempt: int = 1
    done: bool = False


class LeaseMachine(RuleBasedStateMachine):
    store: Store
    examples: itertools.count[int]

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        n = next(self.examples)
        self.clock = VirtualClock()
        self.name, self.queue = f"charge-{n}", f"q-{n}"
        self.model: dict[int, Modelled] = {}

    @initialize(target=claims)
    def a_run_schedules_its_activities(self) -> object:
        store, now, workflow = self.store, self.clock.now(), f"wf-{self.name}"
        store.create_run(f"run-{self.name}", created(workflow, queue=self.queue), now)
        store.schedule_workflow_tasks(now, 100)
        (task,) = store.claim_workflow_tasks({workflow}, "w", now, SHORT, 10)
        result = decide(store, task, now, activities=[self.name] * TASKS, queue=self.queue)
        assert store.complete_workflow_tasks([(task, result)], now) == [True]
        store.schedule_activity_tasks(now, 100)
        # a first claim of them all makes their ids known
        first = store.claim_activity_tasks({self.name}, "first", now, SHORT, TASKS)
        assert len(first) == TASKS and [t.attempt for t in first] == [1] * TASKS
        for claimed in first:
            self.model[claimed.task_id] = Modelled(holder=("first", claimed.lease.version), until=now + SHORT)
        return multiple(*first)

    def _claimable(self) -> list[int]:
        now = self.clock.now()
        return sorted(
            task_id
            for task_id, t in self.model.items()
            if not t.done and t.queued and (t.holder is None or t.until <= now)
        )

    @rule(target=claims, owner=st.sampled_from(["a", "b"]), limit=st.integers(1, 3))
    def claim(self, owner: str, limit: int) -> object:
        now = self.clock.now()
        expected = self._claimable()[:limit]  # the oldest first
        got = self.store.claim_activity_tasks({self.name}, owner, now, SHORT, limit)
        assert [t.task_id for t in got] == expected
        for task in got:
            t = self.model[task.task_id]
            attempt = t.attempt + (1 if t.holder is not None else 0)  # taken over: the next attempt
            assert (task.attempt, task.lease.owner, task.lease.until) == (attempt, owner, now + SHORT)
            assert t.holder is None or task.lease.version > t.holder[1]
            t.attempt, t.holder, t.until = attempt, (owner, task.lease.version), now + SHORT
        return multiple(*got)

    @rule(seconds=st.integers(1, 12))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def the_scheduler_runs(self) -> None:
        now = self.clock.now()
        self.store.schedule_activity_tasks(now, 100)
        for t in self.model.values():
            if not t.queued and t.visible_from <= now:
                t.queued = True

    def _holds(self, task: ActivityTask) -> bool:
        t = self.model[task.task_id]
        return not t.done and t.holder == (task.lease.owner, task.lease.version)

    @rule(task=claims, lease=st.sampled_from([SHORT, LOCK_TIMEOUT * 2]))
    def heartbeat(self, task: ActivityTask, lease: timedelta) -> None:
        now = self.clock.now()
        expected = self._holds(task)
        assert self.store.extend_activity_leases([task], now, lease) == [expected]
        if expected:
            self.model[task.task_id].until = now + min(lease, LOCK_TIMEOUT)

    @rule(task=claims, retry=st.booleans())
    def outcome(self, task: ActivityTask, retry: bool) -> None:
        now = self.clock.now()
        expected = self._holds(task)
        if retry:
            outcome = ActivityOutcome(task=task, failure=failure("again"), retry_at=now + RETRY)
        else:
            outcome = ActivityOutcome(task=task, result=payload(task.task_id))
        assert self.store.complete_activity_tasks([outcome], now) == [expected]
        if expected:
            t = self.model[task.task_id]
            if retry:
                t.queued, t.visible_from, t.holder, t.attempt = False, now + RETRY, None, t.attempt + 1
            else:
                t.done = True


class LeaseModelContract(PortContract):
    def test_activity_leases_behave_as_the_model_says(self, store: Store) -> None:
        machine = type("Machine", (LeaseMachine,), {"store": store, "examples": itertools.count()})
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=30,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


class TestLeaseModelMemory(MemoryBackend, LeaseModelContract):
    pass


class TestLeaseModelPostgres(PostgresBackend, LeaseModelContract):
    pass
