"""Workflow-task claims against a model: a hypothesis state machine over messages, scheduler
rounds, claims, tasks given back, completions and the passing of time, run over each backend.

The model, from docs/reference/contract.md §6–§8 and the WorkflowTaskQueue docstrings: a run with a visible message
and no task gets one task at the scheduler's next round; a task is claimable when nobody holds
it or its lease has run out, oldest first, and each claim's lease has a newer version; only the
claim that holds a task can give it back (``retry_workflow_tasks``: claimable again from the
time given, the version moves on) or complete it; a completion consumes the messages its task
loaded, and messages that arrive after the load wait for the run's next task.

As in the activity model, each example has names and a queue of its own, so one store serves
every example of a test.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, multiple, rule, run_state_machine_as_test

from dex.app.ports.store import Store, WorkflowTask
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    EPOCH,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    created,
    decide,
    event,
)

LEASE = timedelta(seconds=10)
RUNS = 3


@attrs.define
class Run:
    """What the model knows of one run: its waiting messages and its workflow task."""

    order: int  # creation order, which is the scheduler's order at equal priority
    messages: int = 1  # RunStarted
    task: int | None = None  # the model's number for its task (the order tasks were made in)
    holder: tuple[int, str, int] | None = None  # the claim that holds the task now: (task id, owner, version)
    until: datetime = EPOCH  # claimable from then on (a lease's end, or a retry time)
    version: int = 0  # the last claim's lease version (of this task: a new task starts afresh)


class TaskMachine(RuleBasedStateMachine):
    store: Store
    examples: itertools.count[int]

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        n = next(self.examples)
        self.clock = VirtualClock()
        self.workflow = f"wf-{n}"
        self.runs = {f"r{n}-{i}": Run(order=i) for i in range(RUNS)}
        self.tasks_made = itertools.count()

    @initialize()
    def runs_start(self) -> None:
        for run_id in self.runs:
            self.store.create_run(run_id, created(self.workflow, queue=f"q-{self.workflow}"), self.clock.now())

    @rule()
    def the_scheduler_runs(self) -> None:
        self.store.schedule_workflow_tasks(self.clock.now(), 100)
        for run in sorted(self.runs.values(), key=lambda r: r.order):
            if run.task is None and run.messages:
                run.task, run.holder, run.until, run.version = next(self.tasks_made), None, EPOCH, 0

    @rule(run=st.integers(0, RUNS - 1))
    def an_event_arrives(self, run: int) -> None:
        run_id = list(self.runs)[run]
        self.store.send_message(run_id, event("e"), self.clock.now())
        self.runs[run_id].messages += 1

    @rule(seconds=st.integers(1, 12))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(target=claims, owner=st.sampled_from(["a", "b"]), limit=st.integers(1, 3))
    def claim(self, owner: str, limit: int) -> object:
        now = self.clock.now()
        claimable = [
            (run.task, run_id)
            for run_id, run in self.runs.items()
            if run.task is not None and (run.holder is None or run.until <= now)
        ]
        expected = [run_id for _task, run_id in sorted(claimable)][:limit]
        got = self.store.claim_workflow_tasks({self.workflow}, owner, now, LEASE, limit)
        assert [t.run_id for t in got] == expected
        for task in got:
            run = self.runs[task.run_id]
            assert (task.lease.owner, task.lease.until) == (owner, now + LEASE)
            assert task.lease.version > run.version
            run.holder = (task.task_id, owner, task.lease.version)
            run.until, run.version = now + LEASE, task.lease.version
        return multiple(*got)

    def _holds(self, task: WorkflowTask) -> bool:
        run = self.runs[task.run_id]
        return run.task is not None and run.holder == (task.task_id, task.lease.owner, task.lease.version)

    @rule(task=claims, delay=st.integers(0, 10))
    def give_back(self, task: WorkflowTask, delay: int) -> None:
        now = self.clock.now()
        expected = self._holds(task)
        assert self.store.retry_workflow_tasks([(task, now + timedelta(seconds=delay))], now) == [expected]
        if expected:
            run = self.runs[task.run_id]
            run.holder, run.until = (task.task_id, "given back", -1), now + timedelta(seconds=delay)

    @rule(task=claims)
    def complete(self, task: WorkflowTask) -> None:
        now = self.clock.now()
        expected = self._holds(task)
        run = self.runs[task.run_id]
        result = decide(self.store, task, now)
        if expected:
            assert len(result.consumed) == run.messages  # the task sees every message so far
        assert self.store.complete_workflow_tasks([(task, result)], now) == [expected]
        if expected:
            run.messages, run.task, run.holder = 0, None, None


class TaskModelContract(PortContract):
    def test_workflow_task_claims_behave_as_the_model_says(self, store: Store) -> None:
        machine = type("Machine", (TaskMachine,), {"store": store, "examples": itertools.count()})
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=30,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


class TestTaskModelMemory(MemoryBackend, TaskModelContract):
    pass


class TestTaskModelPostgres(PostgresBackend, TaskModelContract):
    pass
