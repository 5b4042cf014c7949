"""Complete, then claim: the ports that claim the next step in the writer's own transaction,
and a started engine that runs a workflow through them alone, on every adapter."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import dex
from dex.app.ports.store import DEFAULT_ACTIVITY_LEASE as LEASE
from dex.app.ports.store import ActivityOutcome, Claim
from dex.domain import events as ev
from dex.domain.values import Payload

OWNER = "eager-node"


@dex.activity
def inc(x: int) -> int:
    return x + 1


@dex.workflow
async def two_steps(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(inc, x)
    return await ctx.activity(inc, x)  # type: ignore[no-any-return]


def _claim(names: frozenset[str], limit: int = 16) -> Claim:
    return Claim(names=names, owner=OWNER, limit=limit, lease=timedelta(seconds=30))


def _first_result(engine: dex.Engine) -> Any:
    """Create a run, schedule and claim its first workflow task, and decide it (not yet written)."""
    run_id = engine.start_workflow(two_steps, 1)
    store = engine.store
    engine.workflow_scheduler.step()
    (task,) = store.claim_workflow_tasks(
        frozenset({"two_steps"}), engine.node_id, store.clock.now(), timedelta(seconds=30), 16
    )
    result = engine.workflow_worker.execute(task)
    assert result is not None and len(result.activity_tasks) == 1
    return run_id, task, result


def test_a_workflow_completion_claims_the_activity_task_it_created(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    run_id, task, result = _first_result(engine)
    store = engine.store
    applied, claimed = store.complete_workflow_tasks_then_claim(
        [(task, result)], store.clock.now(), _claim(frozenset({"inc"}))
    )
    assert applied == [True]
    assert [(t.run_id, t.name, t.attempt, t.lease.owner) for t in claimed] == [(run_id, "inc", 1, OWNER)]
    # it is claimed: nobody else gets it, and its completion under that lease applies
    assert store.claim_activity_tasks(frozenset({"inc"}), "someone-else", store.clock.now(), LEASE, 16) == []
    outcome = ActivityOutcome(task=claimed[0], result=engine.converter.encode(2))
    applied, next_tasks, loaded = store.complete_activity_tasks_then_claim(
        [outcome], store.clock.now(), _claim(frozenset({"two_steps"}))
    )
    assert applied == [True]
    assert [(t.run_id, t.lease.owner) for t in next_tasks] == [(run_id, OWNER)]
    assert loaded == []  # no input asked for


def _claim_after_first_step(engine: dex.Engine) -> tuple[str, int, Any, Any, Any]:
    """Run the first step and write it, then have its activity's completion claim the next
    workflow task with its input loaded from where an executor at the first step stands: the
    run id, that sequence number, the claim's applied flags, the task and its input."""
    run_id, task, result = _first_result(engine)
    store = engine.store
    _applied, (activity,) = store.complete_workflow_tasks_then_claim(
        [(task, result)], store.clock.now(), _claim(frozenset({"inc"}))
    )
    last = result.new_events[-1].sequence_number
    outcome = ActivityOutcome(task=activity, result=engine.converter.encode(2))
    claim = Claim(
        names=frozenset({"two_steps"}), owner=OWNER, limit=4, lease=timedelta(seconds=30), after_seqs={run_id: last}
    )
    applied, (next_task,), (item,) = store.complete_activity_tasks_then_claim([outcome], store.clock.now(), claim)
    return run_id, last, applied, next_task, item


def test_an_activity_completion_can_load_the_input_of_the_task_it_claims(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    run_id, last, applied, next_task, item = _claim_after_first_step(engine)
    assert applied == [True] and next_task.run_id == run_id
    assert not isinstance(item, Exception)
    # the history from where the caller's executor stands (nothing since), and the new answer
    assert [e.sequence_number for e in item.events] == [last]
    assert [type(m.event).__name__ for m in item.inbox] == ["ActivityTaskCompleted"]
    # the same as a separate load in a later transaction gives
    assert engine.store.load_workflow_tasks([(next_task, last)], engine.store.clock.now()) == [item]


def test_a_tail_handed_to_the_worker_after_its_executor_went_is_read_from_the_start(make_engine: Any) -> None:
    """The claim loads the input from where the cached executor stood; if the executor has left
    the cache by the time the worker runs the task (evicted: the cache is bounded), the worker
    reads the whole history instead of replaying the tail (which failed the run)."""
    engine = make_engine([two_steps], [inc])
    run_id, _last, _applied, next_task, item = _claim_after_first_step(engine)
    worker = engine.workflow_worker
    worker.cache.discard(run_id)  # the executor the tail was loaded for is gone
    assert len(worker.cache) == 0
    worker.hand([next_task], [item], engine.store.clock.now())
    assert worker.poll_once(claim=False) == 1
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    assert engine.wait(run_id, timeout=5) == 3


def test_the_claim_keeps_the_queue_rules_pause_and_limit(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    _run_id, task, result = _first_result(engine)
    store = engine.store
    engine.pause_queue("default", "activity")
    applied, claimed = store.complete_workflow_tasks_then_claim(
        [(task, result)], store.clock.now(), _claim(frozenset({"inc"}))
    )
    assert applied == [True] and claimed == []  # written, but a paused queue gives nothing out
    engine.resume_queue("default", "activity")
    engine.activity_scheduler.step()
    assert len(store.claim_activity_tasks(frozenset({"inc"}), "later", store.clock.now(), LEASE, 16)) == 1


def test_a_stale_activity_outcome_is_discarded_and_claims_nothing(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    _run_id, task, result = _first_result(engine)
    store = engine.store
    _applied, (activity,) = store.complete_workflow_tasks_then_claim(
        [(task, result)], store.clock.now(), _claim(frozenset({"inc"}))
    )
    stale = ActivityOutcome(task=activity, result=engine.converter.encode(2))
    store.complete_activity_tasks([stale], store.clock.now())  # the first delivery applies
    applied, claimed, loaded = store.complete_activity_tasks_then_claim(
        [stale], store.clock.now(), _claim(frozenset({"two_steps"}), limit=0)
    )
    assert applied == [False] and claimed == [] and loaded == []


def _created(name: str, *, key: str | None = None, instance: str | None = None) -> ev.RunCreated:
    return ev.RunCreated(
        workflow_name=name,
        input=(Payload(encoding="json/plain", data=b"1"),),
        queue="default",
        instance_id=instance,
        concurrency_key=key,
    )


def test_a_created_run_claims_its_first_task_when_it_may_be_scheduled_at_once(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    store = engine.store
    now = store.clock.now()
    names = frozenset({"two_steps"})
    run_id, claimed, (loaded,) = store.create_run_then_claim("run-plain", _created("two_steps"), now, _claim(names))
    assert run_id == "run-plain"
    assert [(t.run_id, t.lease.owner) for t in claimed] == [("run-plain", OWNER)]
    # its input came along: exactly what a load of the claimed task gives
    assert store.load_workflow_tasks([(claimed[0], 0)], now) == [loaded]
    assert store.schedule_workflow_tasks(now, 16) == 0  # it has its task: the scheduler adds none
    # a keyed run waits for the scheduler, which grants keys; so does a workflow not claimed for
    keyed = store.create_run_then_claim("run-keyed", _created("two_steps", key="k"), now, _claim(names))
    assert keyed == ("run-keyed", [], [])
    other = store.create_run_then_claim("run-other", _created("two_steps"), now, _claim(frozenset({"x"})))
    assert other == ("run-other", [], [])
    assert store.schedule_workflow_tasks(now, 16) == 2
    # a live run with the instance id wins: its id comes back, nothing is created or claimed
    store.create_run("run-first", _created("two_steps", instance="order-1"), now)
    again = store.create_run_then_claim("run-second", _created("two_steps", instance="order-1"), now, _claim(names))
    assert again == ("run-first", [], [])
    assert store.get_run("run-second") is None


def test_a_created_run_in_a_paused_or_full_queue_is_left_to_the_scheduler(make_engine: Any) -> None:
    engine = make_engine([two_steps], [inc])
    store = engine.store
    now = store.clock.now()
    names = frozenset({"two_steps"})
    engine.pause_queue("default", "workflow")
    assert store.create_run_then_claim("run-paused", _created("two_steps"), now, _claim(names))[1] == []
    engine.resume_queue("default", "workflow")
    engine.set_queue_capacity("default", "workflow", 1)
    assert len(store.create_run_then_claim("run-a", _created("two_steps"), now, _claim(names))[1]) == 1
    assert store.create_run_then_claim("run-b", _created("two_steps"), now, _claim(names))[1] == []


def test_a_started_engine_runs_a_workflow_by_eager_dispatch_alone(adapter_factory: Any) -> None:
    # the pollers claim once at start and then only every 60 s: the run can only finish in
    # time if each step claims the next one (create, then claim; complete, then claim)
    engine = dex.Engine(adapter_factory(), workflows=[two_steps], activities=[inc], poll_interval=60)
    engine.start()
    try:
        time.sleep(0.2)  # past the pollers' first round
        started = time.monotonic()
        results = [engine.wait(engine.start_workflow(two_steps, i), timeout=20) for i in range(3)]
        elapsed = time.monotonic() - started
    finally:
        stopping = time.monotonic()
        engine.stop()
    assert results == [2, 3, 4]
    assert elapsed < 20  # with a poll on the path it would wait a minute per hop
    # and stop wakes every thread, the flusher waiting on its buffer included
    assert time.monotonic() - stopping < 10
