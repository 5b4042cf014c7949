"""The simulated nodes: one never-started engine each, and the work it holds between steps.

A :class:`Node` claims tasks, executes them and buffers their results as a started engine's
threads would, but only when the simulator (``simulator.py``) picks it for a step; what it
claimed and has not yet executed waits in its lists, which is what a crash loses. Each node
reaches the shared store through its own :class:`dex.simulation.faults.NodeStore`, where
store-error faults strike.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

import attrs

import dex
from dex.app.inline import InlineActivities, QueueView
from dex.app.ports import ActivityTask, WorkflowTask
from dex.simulation.faults import NodeStore
from dex.simulation.observed import ObservedAdapter

WORKFLOW_LEASE = timedelta(seconds=30)

Log = Callable[[str, str, str | None], None]  # (who, what, detail) into the simulation's trace


@attrs.define
class Node:
    """One simulated engine process and the work it holds between steps."""

    name: str
    engine: dex.Engine
    store: NodeStore  # the node's way to the shared store (store-errors faults strike here)
    workflow_tasks: list[WorkflowTask] = attrs.Factory(list)  # claimed, not yet executed
    activity_tasks: list[ActivityTask] = attrs.Factory(list)  # claimed, not yet executed
    hung: list[ActivityTask] = attrs.Factory(list)  # claimed, never to finish
    stalled_until: int = -1  # the step until which its writes stall

    def held(self) -> int:
        """How many results and tasks the node holds: what a crash loses."""
        return len(self.engine.buffer) + len(self.workflow_tasks) + len(self.activity_tasks) + len(self.hung)

    def claim_workflow_tasks(self, now: datetime, limit: int) -> str:
        tasks = self.store.claim_workflow_tasks(
            frozenset(self.engine.registry.workflows), self.name, now, WORKFLOW_LEASE, limit
        )
        self.workflow_tasks.extend(tasks)
        return _ids(tasks)

    def claim_activity_tasks(self, limit: int) -> str:
        tasks = self.engine.activity_worker.claim(limit)
        self.activity_tasks.extend(tasks)
        return _ids(tasks)

    def run_workflow_task(self, task: WorkflowTask, step_no: int, write_before_rerun: bool) -> str:
        unwritten = any(t.run_id == task.run_id for t, _r in self.engine.buffer._workflow_results)
        if write_before_rerun and unwritten:
            if step_no < self.stalled_until:
                self.workflow_tasks.append(task)
                return f"task {task.task_id} waits: an earlier result of its run is not written yet"
            self.engine.buffer.flush()
        result = self.engine.workflow_worker.execute(task)
        if result is None:
            return f"task {task.task_id}: nothing to write (retention deleted its run, or it was given back)"
        self.engine.buffer.add_workflow_result(task, result)
        return f"task {task.task_id} -> {len(result.new_events)} events"

    def run_activity_task(self, task: ActivityTask) -> str:
        outcome = self.engine.activity_worker.execute(task)
        self.engine.buffer.add_activity_outcome(outcome)
        verdict = "ok" if outcome.result is not None else "retry" if outcome.retry_at is not None else "failed"
        return f"task {task.task_id} {task.name} #{task.attempt} -> {verdict}"

    def finish_held(self, log: Log, step_no: int, write_before_rerun: bool) -> None:
        """Run every task the node holds (a task that must wait for a stalled write stays held)."""
        workflow_tasks, self.workflow_tasks = self.workflow_tasks, []
        for task in workflow_tasks:
            log(self.name, "run-workflow", self.run_workflow_task(task, step_no, write_before_rerun))
        activity_tasks, self.activity_tasks = self.activity_tasks, []
        for activity_task in activity_tasks:
            log(self.name, "run-activity", self.run_activity_task(activity_task))


def new_node(
    name: str,
    shared: ObservedAdapter,
    rng: random.Random,
    engine_over: Callable[[str, NodeStore], dex.Engine],
    inline: bool,
) -> Node:
    """A node named ``name`` over the ``shared`` store, its engine made by ``engine_over``."""
    store = NodeStore(shared, random.Random(rng.getrandbits(64)))
    engine = engine_over(name, store)
    # the backoff of a task given back (retry_later) draws its jitter from the seed too
    engine.workflow_worker._rng = random.Random(rng.getrandbits(64))
    # as in a started engine: results and heartbeats wait in the buffer for a flush step
    engine.buffer.background = True
    if inline:
        for activity in engine.registry.activities:
            engine.activity_worker.durations.record(activity, 0.0)
        engine.workflow_worker.inline = InlineActivities(
            engine.activity_worker, QueueView(store.list_queues, ttl=0), name, 1.0, threading.Event()
        )
    return Node(name=name, engine=engine, store=store)


def _ids(tasks: list[WorkflowTask] | list[ActivityTask]) -> str:
    return " ".join(str(t.task_id) for t in tasks)


T = TypeVar("T")


def pop_any(items: list[T], rng: random.Random) -> T:
    """Take one of ``items`` at random (the simulation's choice of which held task runs next)."""
    return items.pop(rng.randrange(len(items)))
