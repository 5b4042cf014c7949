"""The buffer's side of eager dispatch: which claims it makes, what it reports as left to the
pollers and the scheduler, and that a failed write frees the activity slots it reserved."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.machinery.buffer import SCHEDULING, ResultBuffer
from dex.app.ports.store import ACTIVITY, ActivityTask, Claim, Loaded, WorkflowTask
from dex.testing import VirtualClock

OWNER = "node-under-test"


@dex.activity
def inc(x: int) -> int:
    return x + 1


@dex.workflow
async def one_step(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(inc, x)  # type: ignore[no-any-return]


class StubDispatch:
    """Records what the buffer asks for and hands over."""

    def __init__(self, activity_limit: int) -> None:
        self.activity_limit = activity_limit
        self.activities: list[tuple[Claim, list[ActivityTask]]] = []
        self.workflows: list[WorkflowTask] = []

    def active(self) -> bool:
        return True  # a started engine's

    def activity_claim(self) -> Claim | None:
        return Claim(names=frozenset({"inc"}), owner=OWNER, limit=self.activity_limit)

    def activities_claimed(self, claim: Claim, tasks: list[ActivityTask]) -> None:
        self.activities.append((claim, tasks))

    def workflow_claim(self, run_ids: Any) -> Claim | None:
        return Claim(names=frozenset({"one_step"}), owner=OWNER, limit=8, lease=timedelta(seconds=30))

    def start_claim(self) -> Claim | None:
        return None

    def workflows_claimed(
        self, tasks: list[WorkflowTask], loaded: list[Loaded] | None = None, now: datetime | None = None
    ) -> None:
        self.workflows.extend(tasks)


class RefusingStore(InMemoryAdapter):
    def complete_workflow_tasks_then_claim(self, results: Any, now: Any, claim: Any) -> Any:
        raise ConnectionError("server closed the connection unexpectedly")


def _buffer_with_a_result(store: InMemoryAdapter, dispatch: StubDispatch) -> tuple[ResultBuffer, list[frozenset[str]]]:
    """A started-engine buffer holding the first workflow task's result of a one-step run."""
    engine = dex.Engine(store, workflows=[one_step], activities=[inc])
    engine.start_workflow(one_step, 1)
    engine.workflow_scheduler.step()
    (task,) = store.claim_workflow_tasks(
        frozenset({"one_step"}), engine.node_id, store.clock.now(), timedelta(seconds=30), 1
    )
    result = engine.workflow_worker.execute(task)
    assert result is not None
    reports: list[frozenset[str]] = []
    buffer = ResultBuffer(store, on_flush=reports.append, dispatch=dispatch)
    buffer.add_workflow_result(task, result)
    return buffer, reports


def test_a_result_claims_its_activity_and_leaves_nothing_to_wake() -> None:
    dispatch = StubDispatch(activity_limit=4)
    buffer, reports = _buffer_with_a_result(InMemoryAdapter(clock=VirtualClock()), dispatch)
    assert buffer.flush() == 1
    ((claim, tasks),) = dispatch.activities
    assert claim.limit == 4 and [t.name for t in tasks] == ["inc"]
    assert reports == [frozenset()]  # the claim took all it made: no poller, no scheduler


def test_work_left_for_want_of_room_wakes_the_activity_poller_only() -> None:
    dispatch = StubDispatch(activity_limit=0)  # no slot free: nothing can be claimed
    buffer, reports = _buffer_with_a_result(InMemoryAdapter(clock=VirtualClock()), dispatch)
    buffer.flush()
    ((claim, tasks),) = dispatch.activities
    assert claim.limit == 0 and tasks == []
    assert reports == [frozenset({ACTIVITY})]


def test_work_left_although_there_was_room_wakes_the_scheduler_too() -> None:
    store = InMemoryAdapter(clock=VirtualClock())
    dispatch = StubDispatch(activity_limit=4)
    buffer, reports = _buffer_with_a_result(store, dispatch)
    store.set_queue_paused("default", "activity", True)  # made, but not claimable now
    buffer.flush()
    assert reports == [frozenset({ACTIVITY, SCHEDULING})]


def test_an_answer_claims_the_runs_next_workflow_task() -> None:
    store = InMemoryAdapter(clock=VirtualClock())
    dispatch = StubDispatch(activity_limit=4)
    buffer, reports = _buffer_with_a_result(store, dispatch)
    buffer.flush()
    ((_claim, (activity,)),) = dispatch.activities
    buffer.add_activity_outcome(dex.Engine(store, activities=[inc]).activity_worker.execute(activity))
    buffer.flush()
    assert [t.run_id for t in dispatch.workflows] == [activity.run_id]
    assert reports[-1] == frozenset()  # the answered run's task was claimed: nobody to wake


def test_a_failed_write_frees_the_reserved_slots_and_keeps_the_result() -> None:
    dispatch = StubDispatch(activity_limit=4)
    buffer, reports = _buffer_with_a_result(RefusingStore(clock=VirtualClock()), dispatch)
    with pytest.raises(ConnectionError):
        buffer.flush()
    ((claim, tasks),) = dispatch.activities  # answered, with nothing claimed: the slots go back
    assert claim.limit == 4 and tasks == []
    assert len(buffer) == 1 and reports == []
