"""Inline activities (dex.app.workflows.inline): first attempts of short activities run inside the
workflow task that scheduled them, on every adapter.

The engines here are stepped with ``drain()`` and get their inline policy set by hand (a
started engine sets it in ``start()``), with each activity's duration recorded as zero, so
what runs inline does not depend on timing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.app.ports.store import ActivitySlots, ActivityTask
from dex.app.runtime.options import RuntimeOptions
from dex.app.workflows.inline import QueueView
from dex.domain import events as ev

attempts: list[tuple[str, int]] = []
heartbeats: list[bool] = []


@dex.activity
def inc(x: int) -> int:
    attempts.append(("inc", dex.activity_context().attempt))
    heartbeats.append(dex.activity_context().heartbeat())
    return x + 1


@dex.activity(retry=dex.RetryPolicy(initial_delay=timedelta(seconds=2), randomization_factor=0, max_attempts=3))
def flaky(x: int) -> int:
    attempt = dex.activity_context().attempt
    attempts.append(("flaky", attempt))
    if attempt == 1:
        raise RuntimeError("first attempt fails")
    return x * 10


@dex.activity
def refuse(x: int) -> int:
    raise dex.TerminalError(f"no {x}")


@dex.activity(retry=dex.RetryPolicy(initial_delay=timedelta(minutes=5), randomization_factor=0, max_attempts=2))
def later(x: int) -> int:
    if dex.activity_context().attempt == 1:
        raise RuntimeError("first attempt fails; the retry waits five minutes in the queue")
    return x


@dex.workflow
async def parked(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(later, x)  # type: ignore[no-any-return]


@dex.workflow
async def two_steps(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(inc, x)
    return await ctx.activity(inc, x)  # type: ignore[no-any-return]


@dex.workflow
async def retried(ctx: dex.WorkflowContext, x: int) -> int:
    x = await ctx.activity(inc, x)
    return await ctx.activity(flaky, x)  # type: ignore[no-any-return]


@dex.workflow
async def recovers(ctx: dex.WorkflowContext, x: int) -> str:
    try:
        await ctx.activity(refuse, x)
    except dex.ActivityFailedError as exc:
        x = await ctx.activity(inc, x)
        return f"{exc.failure.message} then {x}"
    return "unreachable"


WORKFLOWS = [two_steps, retried, recovers, parked]
ACTIVITIES = [inc, flaky, refuse, later]


@pytest.fixture(autouse=True)
def _clear() -> None:
    attempts.clear()
    heartbeats.clear()


def _engine(make_engine: Any, *, inline: bool = True, known: bool = True, typical: float = 60.0) -> dex.Engine:
    # drain() runs first attempts inline as a started engine does (the runtime's options)
    options = RuntimeOptions(drain_inline=typical, slots_ttl=0) if inline else RuntimeOptions()
    engine: dex.Engine = make_engine(WORKFLOWS, ACTIVITIES, runtime_options=options)
    if known:
        for name in ("inc", "flaky", "refuse"):
            engine.activity_worker.durations.record(name, 0.001)
    return engine


def _claimed_activity_tasks(engine: dex.Engine) -> list[ActivityTask]:
    """Record every activity task the store gives the engine: by a claim, or by a workflow
    task's completion that claims what it created (eager dispatch), each grant once."""
    claimed: list[ActivityTask] = []
    seen: set[tuple[int, int]] = set()
    store = engine.store
    claim, complete_then_claim = store.claim_activity_tasks, store.complete_workflow_tasks_then_claim

    def record(tasks: list[ActivityTask]) -> None:
        for task in tasks:
            if (task.task_id, task.lease.version) not in seen:
                seen.add((task.task_id, task.lease.version))
                claimed.append(task)

    def counting(*args: Any, **kwargs: Any) -> list[ActivityTask]:
        tasks = claim(*args, **kwargs)
        record(tasks)
        return tasks

    def counting_then_claim(*args: Any, **kwargs: Any) -> Any:
        applied, tasks = complete_then_claim(*args, **kwargs)
        record(tasks)
        return applied, tasks

    store.claim_activity_tasks = counting  # type: ignore[method-assign]
    store.complete_workflow_tasks_then_claim = counting_then_claim  # type: ignore[method-assign]
    return claimed


def _depth(engine: dex.Engine, queue: str) -> int:
    return next(info.depth for info in engine.list_queues() if info.name == queue and info.kind == "activity")


def _hold_a_slot(engine: dex.Engine, clock: Any) -> None:
    """Another node holds a slot of the default activity queue: the task of ``later`` (whose
    duration this engine does not know, so its attempt takes the ordinary path), claimed by
    hand under a lease that outlasts the test."""
    engine.start_workflow(parked, 0)
    engine.workflow_scheduler.step()
    assert engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    held = engine.store.claim_activity_tasks(frozenset({"later"}), "other-node", clock.now(), timedelta(hours=1), 1)
    assert [task.name for task in held] == ["later"]


def _kinds(engine: dex.Engine, run_id: str) -> list[str]:
    return [event.kind for event in engine.history(run_id)]


def test_a_workflow_of_short_activities_runs_in_one_task_with_the_ordinary_history(make_engine: Any) -> None:
    ordinary = _engine(make_engine, inline=False)
    expected = ordinary.start_workflow(two_steps, 1)
    ordinary.drain()

    engine = _engine(make_engine)
    claimed = _claimed_activity_tasks(engine)
    run_id = engine.start_workflow(two_steps, 1)
    engine.drain()

    assert engine.wait(run_id, timeout=0) == 3
    assert claimed == []  # no activity task was ever queued: both attempts ran inside the task
    assert _kinds(engine, run_id) == _kinds(ordinary, expected)  # one block per step, as ever
    started = [e for e in engine.history(run_id) if e.kind == "WorkflowTaskStarted"]
    assert len(started) == 3
    # an inline attempt holds no lease: its heartbeat has nothing to extend and says so
    assert heartbeats == [True] * 4
    assert ("inc", 1) in attempts and all(attempt == 1 for _name, attempt in attempts)


def test_replaying_an_inline_history_gives_the_same_history(make_engine: Any) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(two_steps, 5)
    engine.drain()
    dex.testing.replay(two_steps, engine.history(run_id))  # raises NonDeterminismError on a mismatch


def test_a_failed_inline_attempt_is_retried_later_as_an_ordinary_task(make_engine: Any, clock: Any) -> None:
    engine = _engine(make_engine)
    claimed = _claimed_activity_tasks(engine)
    run_id = engine.start_workflow(retried, 1)
    started = clock.now()
    engine.drain(advance_time=False)
    # inc ran inline, flaky's first attempt failed inline: the run waits for attempt 2
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    assert attempts == [("inc", 1), ("flaky", 1)]
    assert claimed == []
    engine.drain()  # the clock jumps to the retry (2 s later), an ordinary task runs it
    assert engine.wait(run_id, timeout=0) == 20
    assert attempts == [("inc", 1), ("flaky", 1), ("flaky", 2)]
    assert [(t.name, t.attempt) for t in claimed] == [("flaky", 2)]
    assert clock.now() - started >= timedelta(seconds=2)
    assert "ActivityTaskFailed" not in _kinds(engine, run_id)  # retried attempts are not history


def test_a_terminal_inline_failure_reaches_the_workflow_in_the_same_task(make_engine: Any) -> None:
    engine = _engine(make_engine)
    claimed = _claimed_activity_tasks(engine)
    run_id = engine.start_workflow(recovers, 7)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "no 7 then 8"
    assert claimed == []
    assert "ActivityTaskFailed" in _kinds(engine, run_id)


@pytest.mark.parametrize("why", ["paused", "full", "unknown", "slow", "taken over"])
def test_activities_take_the_ordinary_path_when_they_may_not_run_inline(make_engine: Any, clock: Any, why: str) -> None:
    engine = _engine(make_engine, known=why != "unknown", typical=0.0001 if why == "slow" else 60.0)
    claimed = _claimed_activity_tasks(engine)
    if why == "paused":
        engine.pause_queue("default", "activity")
    if why == "full":  # a queue whose one slot is held (by another node's attempt) takes nothing inline
        engine.set_queue_capacity("default", "activity", 1)
        _hold_a_slot(engine, clock)
        claimed.clear()
    run_id = engine.start_workflow(two_steps, 1)
    if why == "taken over":
        # the first claim of the task lapses unfinished; its second claim runs nothing inline
        engine.workflow_scheduler.step()
        lease = engine.workflow_worker.lease
        store = engine.store
        first = store.claim_workflow_tasks(frozenset({"two_steps"}), "lost-node", clock.now(), lease, 1)
        assert len(first) == 1
        clock.advance(lease + timedelta(seconds=1))
    engine.drain(advance_time=False)
    if why == "paused":
        assert attempts == []  # nothing runs from a paused queue, inline or not
        engine.resume_queue("default", "activity")
        engine.drain(advance_time=False)
    if why == "full":
        engine.set_queue_capacity("default", "activity", 2)  # room for one: the next step's task
        engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=0) == 3
    # the first step took the ordinary path; the second, in a later task, runs inline again once
    # the reason is gone (the queue resumed, a duration is known, a fresh task); the slow one
    # never does (in the full queue, the first step's task, done, frees the slot it took)
    ordinary = 2 if why == "slow" else 1
    assert [(t.run_id, t.name) for t in claimed if t.run_id == run_id] == [(run_id, "inc")] * ordinary


def test_retries_waiting_out_their_delay_hold_no_slot_and_turn_nothing_inline_off(make_engine: Any) -> None:
    """A queue is full for inline attempts when its slots are held, as its scheduler counts
    them; a retry parked behind its delay holds none (it did count, and a hundred of them,
    parked behind an outage, turned inline attempts off for every activity of their queue)."""
    engine = _engine(make_engine)
    claimed = _claimed_activity_tasks(engine)
    engine.set_queue_capacity("default", "activity", 1)
    engine.start_workflow(retried, 0)
    engine.drain(advance_time=False)  # flaky's first attempt failed inline: its retry waits 2 s
    assert _depth(engine, "default") == 1
    claimed.clear()
    run_id = engine.start_workflow(two_steps, 1)
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=0) == 3
    assert claimed == []  # both steps ran inline, beside the waiting retry
    assert _depth(engine, "default") == 1


def test_the_engine_checks_its_inline_setting(make_engine: Any) -> None:
    with pytest.raises(ValueError, match="inline_activity_seconds must not be negative"):
        make_engine(WORKFLOWS, ACTIVITIES, inline_activity_seconds=-1)
    with pytest.raises(TypeError, match="inline_activity_seconds must be a number"):
        make_engine(WORKFLOWS, ACTIVITIES, inline_activity_seconds="fast")
    off = make_engine(WORKFLOWS, ACTIVITIES, inline_activity_seconds=0)
    for name in ("inc", "flaky", "refuse"):  # known to be quick: only the setting keeps them out
        off.activity_worker.durations.record(name, 0.001)
    claimed = _claimed_activity_tasks(off)
    off.start()
    try:
        assert off.wait(off.start_workflow(two_steps, 1), timeout=20) == 3
    finally:
        off.stop()
    assert len(claimed) == 2  # both steps ran as tasks of their own
    on = make_engine(WORKFLOWS, ACTIVITIES)
    on.start()
    try:
        assert on.wait(on.start_workflow(two_steps, 1), timeout=20) == 3
    finally:
        on.stop()
    for name in ("inc", "flaky", "refuse"):
        on.activity_worker.durations.record(name, 0.001)
    claimed = _claimed_activity_tasks(on)
    healthy = on.start_workflow(two_steps, 10)
    on.drain()  # stop() turned inline attempts off with the threads: a drain runs none
    assert on.wait(healthy, timeout=5) == 12 and len(claimed) == 2


def test_a_started_engine_runs_known_quick_activities_inline(adapter_factory: Any) -> None:
    engine = dex.Engine(
        adapter_factory(), workflows=WORKFLOWS, activities=ACTIVITIES, poll_interval=0.01, inline_activity_seconds=1.0
    )
    claimed = _claimed_activity_tasks(engine)
    with engine:
        first = engine.start_workflow(two_steps, 1)
        assert engine.wait(first, timeout=20) == 3
        # the first attempt of inc in this process took the ordinary path; the second one, in
        # the next task, already ran inline (its duration was known by then)
        assert [t.run_id for t in claimed] == [first]
        later = [engine.start_workflow(two_steps, i) for i in range(5)]
        assert [engine.wait(run_id, timeout=20) for run_id in later] == [i + 2 for i in range(5)]
    assert [t.run_id for t in claimed] == [first]  # nothing of the later runs was queued
    assert engine.buffer.discarded == 0


def test_in_a_full_queue_a_quick_activitys_outcome_is_answered_and_the_next_steps_run_inline(
    adapter_factory: Any,
) -> None:
    """A quick activity that ran as a task because its queue was full: its outcome is answered
    in its attempt's thread, and the step runs the next activity inline in the room the task
    leaves. (Written the ordinary way, the next step would find the queue full too, and so on
    for every step of every run while a backlog lasts: the "slow steady state".) The engine
    reads the queue as a backlog leaves it, every slot held; its scheduler sees the room."""
    adapter = adapter_factory()
    real = adapter.activity_slots
    adapter.activity_slots = lambda: [attrs.evolve(slots, held=slots.capacity) for slots in real()]
    engine = dex.Engine(
        adapter, workflows=WORKFLOWS, activities=ACTIVITIES, poll_interval=0.01, inline_activity_seconds=1.0
    )
    engine.activity_worker.durations.record("inc", 0.001)
    claimed = _claimed_activity_tasks(engine)
    with engine:
        run_id = engine.start_workflow(two_steps, 1)
        assert engine.wait(run_id, timeout=20) == 3
        # the first inc went through the queue; the second ran inline in the answered step
        assert [t.name for t in claimed if t.run_id == run_id] == ["inc"]
        history = engine.history(run_id)
        dex.testing.replay(two_steps, history)
        assert [e.event.name for e in history if isinstance(e.event, ev.ActivityTaskCreated)] == ["inc"] * 2
        healthy = engine.start_workflow(two_steps, 5)
        assert engine.wait(healthy, timeout=20) == 7
    assert engine.buffer.discarded == 0


def test_room_of_its_own_skips_only_the_capacity_check_never_the_pause() -> None:
    """An answered step's next activity may run inline in its own, full queue (its task is
    the room), but never in a paused one."""
    queues = [ActivitySlots(queue="q", paused=False, capacity=1, held=1)]
    view = QueueView(lambda: list(queues), ttl=0)
    assert not view.open("q")  # full
    assert view.open("q", own_room=True)
    queues[0] = ActivitySlots(queue="q", paused=True, capacity=1, held=0)
    assert not view.open("q")
    assert not view.open("q", own_room=True)
