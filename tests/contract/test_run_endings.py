"""How runs end, on every adapter (docs/reference/contract.md §14): terminate, step cancellation,
deadlines, labels, detached starts and unread events; and the invariant that nothing is
recorded after a run's terminal event."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.app.ports.store import ActivityOutcome
from dex.domain import events as ev
from dex.domain.task import terminate
from dex.testing import VirtualClock

REMOTE = "endings-remote-work"  # an activity no engine of these tests registers: its tasks wait


@dex.activity(name="endings-cleanup")
def cleanup(tag: str) -> str:
    return f"cleaned {tag}"


@dex.workflow(name="endings-child")
async def child(ctx: dex.WorkflowContext) -> str:
    await ctx.wait_for_event("never")
    return "child done"


@dex.workflow(name="endings-busy")
async def busy(ctx: dex.WorkflowContext) -> str:
    ctx.activity(REMOTE, 1)  # pending, never awaited
    ctx.sleep(timedelta(hours=1))
    kid = ctx.child(child)
    await ctx.wait_for_event("go")
    return str(await kid)


@dex.workflow(name="endings-saga")
async def saga(ctx: dex.WorkflowContext, tag: str) -> str:
    try:
        await ctx.wait_for_event("go")
        return "done"
    except dex.CancelledError:
        await ctx.activity(cleanup, tag)
        raise


@dex.workflow(name="endings-waiter")
async def waiter(ctx: dex.WorkflowContext) -> str:
    return str(await ctx.wait_for_event("go"))


def assert_ends_once(history: list[ev.HistoryEvent]) -> None:
    """The run's terminal event is the last thing recorded (only its task's end follows it)."""
    kinds = [e.kind for e in history]
    assert kinds.count("RunCompleted") == 1, kinds
    assert kinds[-2:] == ["RunCompleted", "WorkflowTaskCompleted"], kinds


def healthy(engine: dex.Engine) -> None:
    """A run started now completes: what went before harmed only its own run."""
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    engine.send_event(run_id, "go", "fine")
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == "fine"


# -- terminate ---------------------------------------------------------------------------------
def test_terminate_stops_the_run_at_once_drops_its_steps_and_terminates_its_children(make_engine: Any) -> None:
    engine = make_engine([busy, child, waiter])
    run_id = engine.start_workflow(busy)
    engine.drain(advance_time=False)
    kids = [r.run_id for r in engine.list_runs(workflow_name="endings-child")]
    assert len(kids) == 1 and engine.get_run(run_id).status is dex.RunStatus.RUNNING
    assert engine.store.step_attempts(run_id)  # the remote activity's task waits
    engine.terminate(run_id, reason="operator")
    info = engine.get_run(run_id)  # at once: no worker needed
    assert info.status is dex.RunStatus.TERMINATED
    assert info.failure is not None and info.failure.message == "operator"
    history = engine.history(run_id)
    assert [e.kind for e in history][-4:] == [
        "WorkflowTaskStarted",
        "RunTerminated",
        "RunCompleted",
        "WorkflowTaskCompleted",
    ]
    assert all(s.pending is None for s in engine.store.step_attempts(run_id))  # its activity task is gone
    with pytest.raises(dex.WorkflowCancelledError, match="terminated: operator"):
        engine.wait(run_id, timeout=1)
    child_info = engine.get_run(kids[0])  # by the call too
    assert child_info.status is dex.RunStatus.TERMINATED
    assert child_info.failure is not None and child_info.failure.message == f"parent run {run_id} was terminated"
    assert_ends_once(engine.history(kids[0]))
    engine.drain(advance_time=True)  # the timer's hour passes
    assert_ends_once(engine.history(run_id))
    assert engine.history(run_id) == history  # the timer fired into no inbox: nothing was added
    with pytest.raises(dex.InvalidStateError):
        engine.terminate(run_id)
    with pytest.raises(dex.InvalidStateError):
        engine.cancel(run_id)
    healthy(engine)


def test_terminate_runs_no_cleanup_where_cancel_does(make_engine: Any) -> None:
    engine = make_engine([saga, waiter], [cleanup])
    cancelled, terminated = engine.start_workflow(saga, "a"), engine.start_workflow(saga, "b")
    engine.drain(advance_time=False)
    engine.cancel(cancelled, "stop")
    engine.terminate(terminated, "stop")
    engine.drain(advance_time=False)
    assert engine.get_run(cancelled).status is dex.RunStatus.CANCELLED
    assert "ActivityTaskCompleted" in [e.kind for e in engine.history(cancelled)]
    assert engine.get_run(terminated).status is dex.RunStatus.TERMINATED
    assert "ActivityTaskCreated" not in [e.kind for e in engine.history(terminated)]
    assert_ends_once(engine.history(cancelled))
    assert_ends_once(engine.history(terminated))


def test_an_engine_without_the_code_terminates_a_run_and_its_children(make_engine: Any) -> None:
    worker = make_engine([busy, child, waiter])
    run_id = worker.start_workflow(busy)
    worker.drain(advance_time=False)
    (kid,) = worker.list_runs(workflow_name="endings-child")
    bare = make_engine()  # as `dex web` over the database: no workflow code
    bare.terminate(run_id, "from the dashboard")
    assert bare.get_run(run_id).status is dex.RunStatus.TERMINATED
    assert bare.get_run(kid.run_id).status is dex.RunStatus.TERMINATED
    worker.drain(advance_time=False)  # the parent's ChildRunFailed went nowhere: it had ended
    assert_ends_once(worker.history(run_id))
    assert_ends_once(worker.history(kid.run_id))
    healthy(worker)


def test_terminate_of_an_unknown_run_is_refused(make_engine: Any) -> None:
    engine = make_engine([waiter])
    with pytest.raises(dex.RunNotFoundError):
        engine.terminate("no-such-run")
    healthy(engine)


def test_a_created_run_that_no_engine_can_run_is_cancelled_or_terminated_at_once(make_engine: Any) -> None:
    worker = make_engine([waiter])
    first, second = worker.start_workflow(waiter), worker.start_workflow(waiter)
    bare = make_engine()  # runs no workflow; no started engine registers "endings-waiter"
    bare.cancel(first, "nobody runs it")
    bare.terminate(second, "nobody runs it")
    cancelled = bare.get_run(first)
    assert cancelled.status is dex.RunStatus.CANCELLED
    assert cancelled.failure is not None and "nobody runs it" in cancelled.failure.message
    assert bare.get_run(second).status is dex.RunStatus.TERMINATED
    for run_id in (first, second):
        assert_ends_once(bare.history(run_id))
    worker.drain(advance_time=False)  # the code that appears later replays the recorded end
    assert worker.get_run(first).status is dex.RunStatus.CANCELLED
    healthy(worker)


def test_a_created_run_its_own_engine_can_run_gets_the_cancel_as_a_request(make_engine: Any) -> None:
    engine = make_engine([saga], [cleanup])
    run_id = engine.start_workflow(saga, "c")
    engine.cancel(run_id, "before it started")
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED  # the code decides, at its first task
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED


@dex.workflow(name="endings-careful-child")
async def careful_child(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_for_event("never")
        return "child done"
    except dex.CancelledError:
        await ctx.activity(cleanup, "child")
        raise


@dex.workflow(name="endings-careful-parent")
async def careful_parent(ctx: dex.WorkflowContext) -> str:
    return str(await ctx.child(careful_child))


def test_the_children_of_a_cancelled_run_get_the_same_request_and_clean_up(make_engine: Any) -> None:
    engine = make_engine([careful_parent, careful_child], [cleanup])
    run_id = engine.start_workflow(careful_parent)
    engine.drain(advance_time=False)
    (kid,) = engine.list_runs(workflow_name="endings-careful-child")
    engine.cancel(run_id, "stop all")
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED
    assert engine.get_run(kid.run_id).status is dex.RunStatus.CANCELLED
    kid_history = engine.history(kid.run_id)
    assert "ActivityTaskCompleted" in [e.kind for e in kid_history]  # its cleanup ran
    assert_ends_once(kid_history)
    assert_ends_once(engine.history(run_id))


# -- deadlines ---------------------------------------------------------------------------------
def test_a_deadline_cancels_the_run_with_reason_timeout_and_its_cleanup_runs(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([saga, waiter], [cleanup])
    run_id = engine.start_workflow(saga, "late", timeout=timedelta(minutes=5))
    info = engine.get_run(run_id)
    assert info.deadline == info.created_at + timedelta(minutes=5)
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    clock.advance(timedelta(minutes=6))
    engine.drain(advance_time=False)
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.CANCELLED
    assert info.failure is not None and info.failure.message == "the run was cancelled: timeout"
    history = engine.history(run_id)
    assert "ActivityTaskCompleted" in [e.kind for e in history]
    assert_ends_once(history)
    healthy(engine)


@dex.workflow(name="endings-parent")
async def parent(ctx: dex.WorkflowContext) -> str:
    try:
        return str(await ctx.child(child, timeout=timedelta(seconds=30)))
    except dex.ChildWorkflowFailedError as exc:
        return f"child ended: {exc}"


def test_a_childs_deadline_cancels_the_child_and_the_parent_learns_it(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([parent, child])
    run_id = engine.start_workflow(parent)
    engine.drain(advance_time=False)
    (kid,) = engine.list_runs(workflow_name="endings-child")
    assert kid.deadline is not None
    clock.advance(timedelta(minutes=1))
    engine.drain(advance_time=False)
    assert engine.get_run(kid.run_id).status is dex.RunStatus.CANCELLED
    assert "timeout" in engine.wait(run_id, timeout=5)


def test_a_deadline_that_passes_during_cleanup_records_nothing_after_the_end(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([slow_saga], [cleanup])
    run_id = engine.start_workflow(slow_saga, timeout=timedelta(minutes=10))
    engine.drain(advance_time=False)
    engine.cancel(run_id, "first")
    engine.drain(advance_time=False)  # the cleanup sleeps for an hour: the deadline comes first
    clock.advance(timedelta(hours=2))
    engine.drain(advance_time=False)
    engine.drain(advance_time=False)
    history = engine.history(run_id)
    assert_ends_once(history)
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED


@dex.workflow(name="endings-slow-saga")
async def slow_saga(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_for_event("go")
        return "done"
    except dex.CancelledError:
        await ctx.sleep(timedelta(hours=1))
        await ctx.activity(cleanup, "slow")
        raise


@pytest.mark.parametrize("timeout", [-1, timedelta(seconds=-1), "soon", float("nan"), float("inf"), True])
def test_a_timeout_no_deadline_can_come_from_is_refused_at_the_call(make_engine: Any, timeout: Any) -> None:
    engine = make_engine([waiter])
    with pytest.raises((TypeError, ValueError)):
        engine.start_workflow(waiter, timeout=timeout)
    assert engine.list_runs() == []
    healthy(engine)


# -- step cancellation -------------------------------------------------------------------------
@dex.workflow(name="endings-cancel-steps")
async def cancel_steps(ctx: dex.WorkflowContext) -> str:
    running = ctx.activity(REMOTE, 1)
    queued = ctx.activity(REMOTE, 2)
    timer = ctx.sleep(timedelta(minutes=30))
    await ctx.wait_for_event("go")
    running.cancel()
    queued.cancel()
    timer.cancel()
    outcomes = []
    for step in (running, queued, timer):
        try:
            await step
        except dex.CancelledError:
            outcomes.append("cancelled")
    await ctx.wait_for_event("end")
    return ",".join(outcomes)


def test_cancelled_steps_are_dropped_and_a_running_attempt_is_told_and_not_recorded(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([cancel_steps])
    store = engine.store
    run_id = engine.start_workflow(cancel_steps)
    engine.drain(advance_time=False)
    store.schedule_activity_tasks(clock.now(), 10)
    (claimed,) = store.claim_activity_tasks([REMOTE], "remote-worker", clock.now(), timedelta(minutes=5), 1)
    engine.send_event(run_id, "go")
    engine.drain(advance_time=False)
    assert all(s.pending is None for s in store.step_attempts(run_id))  # both tasks are gone
    # the running attempt learns it at its heartbeat; what it returns is not recorded
    assert store.extend_activity_leases([claimed], clock.now(), timedelta(minutes=1)) == [False]
    outcome = ActivityOutcome(task=claimed, result=engine.converter.encode("late"))
    assert store.complete_activity_tasks([outcome], clock.now()) == [False]
    before = engine.history(run_id)
    clock.advance(timedelta(hours=1))  # the cancelled timer's firing was deleted with it
    engine.drain(advance_time=False)
    assert engine.history(run_id) == before
    engine.send_event(run_id, "end")
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == "cancelled,cancelled,cancelled"
    kinds = [e.kind for e in engine.history(run_id)]
    assert kinds.count("CancelRequested") == 3
    assert "ActivityTaskCompleted" not in kinds and "TimerFired" not in kinds


@dex.workflow(name="endings-racing")
async def racing(ctx: dex.WorkflowContext) -> str:
    try:
        return str(await ctx.activity(REMOTE, 1))
    except dex.CancelledError:
        await ctx.activity(cleanup, "race")
        raise


def test_a_cancel_racing_an_activity_result_records_nothing_after_the_end(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([racing], [cleanup])
    store = engine.store
    run_id = engine.start_workflow(racing)
    engine.drain(advance_time=False)
    store.schedule_activity_tasks(clock.now(), 10)
    (claimed,) = store.claim_activity_tasks([REMOTE], "remote-worker", clock.now(), timedelta(minutes=5), 1)
    engine.cancel(run_id, "race")  # the cancel is in the inbox first...
    outcome = ActivityOutcome(task=claimed, result=engine.converter.encode("won"))
    store.complete_activity_tasks([outcome], clock.now())  # ...then the result, before any task
    engine.drain(advance_time=False)
    history = engine.history(run_id)
    assert_ends_once(history)
    assert engine.get_run(run_id).status in (dex.RunStatus.CANCELLED, dex.RunStatus.COMPLETED)


# -- labels, detached runs, unread events ----------------------------------------------------------
@dex.workflow(name="endings-labels")
async def relabel(ctx: dex.WorkflowContext) -> str:
    ctx.set_labels({"stage": "shipping", "old": None})
    await ctx.wait_for_event("go")
    return "ok"


def test_set_labels_replaces_the_runs_labels_in_the_store(make_engine: Any) -> None:
    engine = make_engine([relabel])
    run_id = engine.start_workflow(relabel, labels={"old": "x", "team": "a"})
    assert [r.run_id for r in engine.list_runs(labels={"old": "x"})] == [run_id]
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).labels == {"stage": "shipping", "team": "a"}
    assert [r.run_id for r in engine.list_runs(labels={"stage": "shipping"})] == [run_id]
    assert engine.list_runs(labels={"old": "x"}) == []


@dex.workflow(name="endings-starter")
async def starter(ctx: dex.WorkflowContext, instance: str) -> list[str]:
    return [ctx.start_workflow(waiter, instance_id=instance, timeout=timedelta(hours=1))]


def test_a_detached_run_has_no_parent_and_outlives_its_starter(make_engine: Any) -> None:
    engine = make_engine([starter, waiter])
    run_id = engine.start_workflow(starter, "detached-1")
    engine.drain(advance_time=False)
    (started,) = engine.wait(run_id, timeout=5)
    info = engine.get_run(started)
    assert info.parent_run_id is None and info.instance_id == "detached-1"
    assert info.status is dex.RunStatus.RUNNING and info.deadline is not None
    engine.send_event(started, "go", "on its own")
    engine.drain(advance_time=False)
    assert engine.wait(started, timeout=5) == "on its own"


def test_a_detached_start_whose_instance_id_is_held_returns_a_run_naming_the_holder(make_engine: Any) -> None:
    engine = make_engine([starter, waiter])
    holder = engine.start_workflow(waiter, instance_id="held")
    run_id = engine.start_workflow(starter, "held")
    engine.drain(advance_time=False)
    (returned,) = engine.wait(run_id, timeout=5)
    assert returned != holder
    info = engine.get_run(returned)  # the id names a run: one that never ran
    assert info.status is dex.RunStatus.TERMINATED
    assert info.failure is not None and holder in info.failure.message
    assert_ends_once(engine.history(returned))
    assert engine.get_run(holder).status is dex.RunStatus.RUNNING  # the holder is untouched
    assert [r.run_id for r in engine.list_runs(instance_id="held", statuses=["RUNNING"])] == [holder]


def test_events_a_run_never_read_are_counted_when_it_ends(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).unread_events == 0
    engine.send_event(run_id, "note", 1)
    engine.send_event(run_id, "note", 2)
    engine.send_event(run_id, "go", "done")
    engine.drain(advance_time=False)
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.COMPLETED and info.unread_events == 2


# -- poison ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reason", ["nul\x00", "lone \ud800", 7])
def test_a_reason_no_store_can_hold_is_refused_and_the_run_goes_on(make_engine: Any, reason: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    with pytest.raises((TypeError, ValueError)):
        engine.terminate(run_id, reason)
    with pytest.raises((TypeError, ValueError)):
        engine.cancel(run_id, reason)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    engine.terminate(run_id, "a fine reason")
    assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
    healthy(engine)


POISON = {"fine": "fine", "nul": "a\x00b", "surrogate": "a\udc00b"}


@dex.workflow(name="endings-bad-labels")
async def bad_labels(ctx: dex.WorkflowContext, kind: str, where: str) -> str:
    value = POISON[kind]  # made here: no argument can carry a lone surrogate
    ctx.set_labels({"k": value} if where == "value" else {value: "v"})
    return "labelled"


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
@pytest.mark.parametrize("where", ["value", "key"])
def test_a_label_no_store_can_hold_fails_only_its_run(make_engine: Any, kind: str, where: str) -> None:
    engine = make_engine([bad_labels, waiter])
    bad = engine.start_workflow(bad_labels, kind, where)
    good = engine.start_workflow(bad_labels, "fine", where)
    engine.drain(advance_time=False)
    with pytest.raises(dex.WorkflowFailedError):
        engine.wait(bad, timeout=5)
    assert engine.get_run(bad).labels == {}
    assert engine.wait(good, timeout=5) == "labelled"
    assert engine.get_run(good).labels == ({"k": "fine"} if where == "value" else {"fine": "v"})
    healthy(engine)


class _Failing(Exception):
    pass


def test_a_store_failing_mid_terminate_leaves_the_run_as_it_was(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    before = engine.history(run_id)

    def decide_then_fail(*_args: Any) -> Any:
        raise _Failing("the store failed")

    with pytest.raises(_Failing):
        engine.store.end_run(run_id, decide_then_fail, engine.store.clock.now())
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING and engine.history(run_id) == before
    engine.terminate(run_id, "after the fault")
    assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
    healthy(engine)


def test_a_store_refusing_a_terminate_halfway_writes_none_of_it(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    engine.send_event(run_id, "note", "kept")
    before = engine.history(run_id)
    now = engine.store.clock.now()

    def poisoned(history: Any, inbox: Any) -> Any:  # a value the store refuses midway through its writes
        return attrs.evolve(terminate(run_id, history, inbox, "x", now), custom_status="bad\x00")

    with pytest.raises(Exception) as refused:
        engine.store.end_run(run_id, poisoned, now)
    assert not isinstance(refused.value, AssertionError)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING and engine.history(run_id) == before
    engine.send_event(run_id, "go", "still here")  # its inbox kept the note, and takes more
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5) == "still here"
    assert engine.get_run(run_id).unread_events == 1  # the note
    healthy(engine)


@pytest.mark.parametrize("kind", ["before", "after", "timeout"])
def test_a_store_failing_at_terminate_fails_the_call_and_a_retry_settles_it(adapter_factory: Any, kind: str) -> None:
    from tests.faults import FaultyStore

    faulty = FaultyStore(adapter_factory(), rate=1.0, weights={kind: 1.0})
    engine = dex.Engine(faulty, workflows=[waiter])  # type: ignore[arg-type]
    try:
        run_id = engine.start_workflow(waiter)
        engine.drain(advance_time=False)
        faulty.enabled = True
        with pytest.raises((ConnectionError, TimeoutError)):
            engine.terminate(run_id, "flaky")
        faulty.enabled = False
        if kind == "after":  # it was written; the caller could not know: the retry says so
            with pytest.raises(dex.InvalidStateError):
                engine.terminate(run_id, "flaky")
        else:
            assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
            engine.terminate(run_id, "flaky")
        assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
        assert_ends_once(engine.history(run_id))
        healthy(engine)
    finally:
        engine.stop(timeout=5)


class _Unprintable(BaseException):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_base_exception_that_cannot_be_printed_in_cleanup_fails_only_its_run(make_engine: Any) -> None:
    engine = make_engine([hostile_cleanup, waiter])
    run_id = engine.start_workflow(hostile_cleanup)
    engine.drain(advance_time=False)
    engine.cancel(run_id, "stop")
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status.is_terminal
    assert_ends_once(engine.history(run_id))
    healthy(engine)


@dex.workflow(name="endings-hostile-cleanup")
async def hostile_cleanup(ctx: dex.WorkflowContext) -> str:
    try:
        await ctx.wait_for_event("go")
    finally:
        raise _Unprintable()


def test_a_remote_worker_learns_at_its_heartbeat_that_its_step_was_cancelled(
    make_engine: Any, clock: VirtualClock
) -> None:
    from dex.remote import ActivityTaskService
    from dex.remote.errors import LeaseLostError

    engine = make_engine([cancel_steps])
    run_id = engine.start_workflow(cancel_steps)
    engine.drain(advance_time=False)
    service = ActivityTaskService(engine.store)
    engine.store.schedule_activity_tasks(clock.now(), 10)
    polled = service.poll("remote-worker", [REMOTE], max_tasks=2, wait_seconds=0)
    assert len(polled) == 2
    assert [service.heartbeat(t.task_id, t.lease_version, "remote-worker") for t in polled] == [False, False]
    engine.send_event(run_id, "go")
    engine.drain(advance_time=False)
    assert [service.heartbeat(t.task_id, t.lease_version, "remote-worker") for t in polled] == [True, True]
    with pytest.raises(LeaseLostError):  # what it returns is not recorded
        service.complete(polled[0].task_id, polled[0].lease_version, "late", "remote-worker")
    assert "ActivityTaskCompleted" not in [e.kind for e in engine.history(run_id)]


# -- on a started engine -----------------------------------------------------------------------------
STARTED_SEEN: dict[str, Any] = {}


@dex.activity(name="endings-long", lock_timeout=timedelta(seconds=30))
def long_work(tag: str) -> str:
    import time

    context = dex.activity_context()
    STARTED_SEEN[tag] = "running"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not context.heartbeat() or context.cancel_requested:
            STARTED_SEEN[tag] = "told"
            return "returned after the cancel"  # not recorded
        time.sleep(0.01)
    STARTED_SEEN[tag] = "never told"
    return "finished"


@dex.workflow(name="endings-long-step")
async def long_step(ctx: dex.WorkflowContext, tag: str) -> str:
    step = ctx.activity(long_work, tag)
    await ctx.wait_for_event("stop")
    step.cancel()
    try:
        return str(await step)
    except dex.CancelledError:
        return "step cancelled"


@dex.workflow(name="endings-long-run")
async def long_run(ctx: dex.WorkflowContext, tag: str) -> str:
    return str(await ctx.activity(long_work, tag))


def _until(predicate: Any, seconds: float = 10) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_started_engine_tells_a_running_activity_of_its_cancelled_step(adapter_factory: Any) -> None:
    STARTED_SEEN.clear()
    engine = dex.Engine(adapter_factory(), workflows=[long_step], activities=[long_work], poll_interval=0.01)
    with engine:
        run_id = engine.start_workflow(long_step, "step")
        _until(lambda: STARTED_SEEN.get("step") == "running")
        engine.send_event(run_id, "stop")
        assert engine.wait(run_id, timeout=20) == "step cancelled"
        _until(lambda: STARTED_SEEN.get("step") == "told")
    kinds = [e.kind for e in engine.history(run_id)]
    assert "ActivityTaskCompleted" not in kinds
    assert_ends_once(engine.history(run_id))


def test_a_started_engine_terminates_a_run_whose_activity_runs(adapter_factory: Any) -> None:
    STARTED_SEEN.clear()
    engine = dex.Engine(adapter_factory(), workflows=[long_run, waiter], activities=[long_work], poll_interval=0.01)
    with engine:
        run_id = engine.start_workflow(long_run, "run")
        _until(lambda: STARTED_SEEN.get("run") == "running")
        engine.terminate(run_id, "now")
        assert engine.get_run(run_id).status is dex.RunStatus.TERMINATED
        _until(lambda: STARTED_SEEN.get("run") == "told")
        healthy_id = engine.start_workflow(waiter)
        engine.send_event(healthy_id, "go", "after")
        assert engine.wait(healthy_id, timeout=20) == "after"
    history = engine.history(run_id)
    assert "ActivityTaskCompleted" not in [e.kind for e in history]
    assert_ends_once(history)


def test_a_suspended_run_can_be_terminated(make_engine: Any) -> None:
    engine = make_engine([waiter])
    run_id = engine.start_workflow(waiter)
    engine.drain(advance_time=False)
    engine.suspend(run_id)
    engine.send_event(run_id, "go", "held")  # held while suspended: never read
    engine.drain(advance_time=False)
    engine.terminate(run_id, "suspended for too long")
    info = engine.get_run(run_id)
    assert info.status is dex.RunStatus.TERMINATED
    assert info.unread_events == 1  # the held event, dropped with the inbox
    assert_ends_once(engine.history(run_id))
    healthy(engine)


@dex.workflow(name="endings-bad-child-timeout")
async def bad_child_timeout(ctx: dex.WorkflowContext, how: str) -> str:
    timeout: Any = {"negative": -5, "nan": float("nan"), "text": "soon"}[how]
    try:
        ctx.child(child, timeout=timeout)
    except (TypeError, ValueError) as exc:
        return f"refused: {type(exc).__name__}"
    return "accepted"


@pytest.mark.parametrize("how", ["negative", "nan", "text"])
def test_a_bad_child_timeout_is_refused_at_the_call_in_the_workflow(make_engine: Any, how: str) -> None:
    engine = make_engine([bad_child_timeout, child, waiter])
    run_id = engine.start_workflow(bad_child_timeout, how)
    engine.drain(advance_time=False)
    assert engine.wait(run_id, timeout=5).startswith("refused")
    assert engine.list_runs(workflow_name="endings-child") == []
    healthy(engine)


def test_terminate_and_cancel_are_awaitable(make_engine: Any) -> None:
    import asyncio

    engine = make_engine([saga, waiter], [cleanup])
    first, second = engine.start_workflow(saga, "x"), engine.start_workflow(saga, "y")
    engine.drain(advance_time=False)

    async def end_both() -> None:
        await engine.terminate_async(first, "async")
        await engine.cancel_async(second, "async")

    asyncio.run(end_both())
    assert engine.get_run(first).status is dex.RunStatus.TERMINATED
    engine.drain(advance_time=False)
    assert engine.get_run(second).status is dex.RunStatus.CANCELLED
    with pytest.raises(dex.InvalidStateError):
        asyncio.run(engine.terminate_async(first))
