"""``Engine.fork`` on every adapter (docs/reference/contract.md §11): a new run whose history is the original's up to
the end of a workflow task, so the steps recorded there are not repeated and those pending
there run again, with the code registered now; ``RunInfo.forked_from`` names the original."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.adapters.memory.tasks import MemoryTasks
from dex.testing import VirtualClock

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@dex.activity(name="fork-reserve")
def reserve(item: str) -> str:
    CALLS["reserve"] += 1
    return f"reserved {item}"


@dex.activity(name="fork-charge", retry=dex.RetryPolicy(max_attempts=1))
def charge_broken(item: str) -> str:
    CALLS["charge"] += 1
    raise ConnectionError("the payment service is down")


@dex.activity(name="fork-charge", retry=dex.RetryPolicy(max_attempts=1))
def charge_fixed(item: str) -> str:
    CALLS["charge"] += 1
    return f"charged {item}"


@dex.workflow(name="fork-order")
async def order(ctx: dex.WorkflowContext, item: str) -> str:
    reserved = await ctx.activity(reserve, item)
    await ctx.sleep(timedelta(minutes=5))
    charged = await ctx.activity("fork-charge", item)
    return f"{reserved}, {charged}"


@dex.workflow(name="fork-payment")
async def payment(ctx: dex.WorkflowContext, item: str) -> str:
    return await ctx.activity("fork-charge", item)  # type: ignore[no-any-return]


@dex.workflow(name="fork-parent")
async def parent(ctx: dex.WorkflowContext) -> list[str]:
    first = await ctx.child(payment, "first")  # fails while the payment service is down
    return [first, await ctx.child(payment, "second")]


@dex.workflow(name="fork-two-children")
async def two_children(ctx: dex.WorkflowContext) -> list[str]:
    done = await ctx.child("fork-reserving", "first")  # finishes before the outage
    return [done, await ctx.child(payment, "second")]


@dex.workflow(name="fork-reserving")
async def reserving(ctx: dex.WorkflowContext, item: str) -> str:
    return await ctx.activity(reserve, item)  # type: ignore[no-any-return]


@dex.workflow(name="fork-gate")
async def gate(ctx: dex.WorkflowContext) -> str:
    go = await ctx.wait_for_event("go")
    return await ctx.activity("fork-charge", go)  # type: ignore[no-any-return]


@dex.workflow(name="fork-nap")
async def nap(ctx: dex.WorkflowContext) -> str:
    await ctx.sleep(timedelta(hours=1))
    return "rested"


@dex.workflow(name="fork-healthy")
async def healthy(ctx: dex.WorkflowContext) -> str:
    return await ctx.activity(reserve, "healthy")  # type: ignore[no-any-return]


WORKFLOWS = [order, payment, parent, two_children, reserving, gate, nap, healthy]


def _v1(make_engine: Any) -> dex.Engine:
    return make_engine(WORKFLOWS, [reserve, charge_broken], code_version="v1")  # type: ignore[no-any-return]


def _v2(make_engine: Any) -> dex.Engine:
    return make_engine(WORKFLOWS, [reserve, charge_fixed], code_version="v2")  # type: ignore[no-any-return]


def _failed_order(make_engine: Any) -> str:
    v1 = _v1(make_engine)
    run_id: str = v1.start_workflow(order, "book")
    v1.drain()
    assert v1.get_run(run_id).status is dex.RunStatus.FAILED
    assert CALLS == {"reserve": 1, "charge": 1}
    return run_id


def _kinds(engine: dex.Engine, run_id: str) -> list[str]:
    return [item.kind for item in engine.history(run_id)]


def _completes(engine: dex.Engine) -> None:
    """A healthy run started now completes: the fork (or its refusal) harmed nobody."""
    run_id = engine.start_workflow(healthy)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "reserved healthy"


def test_a_failed_run_forked_once_fixed_completes_without_repeating_its_recorded_steps(make_engine: Any) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)  # the bug is fixed: an engine with the new code
    fork_id = v2.fork(run_id)
    assert fork_id != run_id
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "reserved book, charged book"
    assert CALLS == {"reserve": 1, "charge": 2}  # the reservation was recorded: not made again
    info = v2.get_run(fork_id)
    assert info.forked_from == run_id and info.code_version == "v2" and info.status is dex.RunStatus.COMPLETED
    assert info.workflow_name == "fork-order" and info.parent_run_id is None
    assert v2.get_run(run_id).status is dex.RunStatus.FAILED  # the original is left as it was
    assert v2.get_run(run_id).forked_from is None
    original, forked = v2.history(run_id), v2.history(fork_id)
    point = max(i for i, item in enumerate(original) if item.kind == "WorkflowTaskCompleted" and i < len(original) - 1)
    # the default point: the end of the last task before the one that failed the run
    assert [item.event for item in forked[1 : point + 1]] == [item.event for item in original[1 : point + 1]]
    assert _kinds(v2, fork_id).count("ActivityTaskCreated") == 2 and "ActivityTaskFailed" not in _kinds(v2, fork_id)


def test_a_fork_at_a_given_sequence_number_runs_again_what_was_pending_there(make_engine: Any) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)
    first_task_end = _kinds(v2, run_id).index("WorkflowTaskCompleted") + 1  # the reservation is pending there
    fork_id = v2.fork(run_id, at=first_task_end)
    assert [item.sequence_number for item in v2.history(fork_id)] == list(range(1, first_task_end + 1))
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "reserved book, charged book"
    assert CALLS == {"reserve": 2, "charge": 2}
    from_start = v2.fork(run_id, at=1)  # 1: from the start, as a new run of the same input
    assert v2.get_run(from_start).status is dex.RunStatus.CREATED
    v2.drain()
    assert v2.wait(from_start, timeout=5) == "reserved book, charged book"
    assert CALLS == {"reserve": 3, "charge": 3}
    assert v2.get_run(from_start).forked_from == run_id


def test_a_live_run_forks_at_its_last_task_and_a_pending_timer_keeps_its_due_time(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = _v2(make_engine)
    run_id = engine.start_workflow(nap)
    engine.drain(advance_time=False)
    due = clock.now() + timedelta(hours=1)
    clock.advance(timedelta(minutes=20))
    fork_id = engine.fork(run_id)  # RUNNING: its last completed task is the point
    assert _kinds(engine, fork_id) == _kinds(engine, run_id)
    engine.drain(advance_time=False)
    assert engine.get_run(fork_id).status is dex.RunStatus.RUNNING  # the timer is not due yet
    clock.advance_to(due)
    engine.drain(advance_time=False)
    assert engine.wait(fork_id, timeout=5) == "rested"
    assert engine.history(fork_id)[-2].timestamp == due  # it fired at the original's due time
    late = engine.start_workflow(nap)
    engine.drain(advance_time=False)
    clock.advance(timedelta(hours=2))  # its timer is overdue when it is forked: it fires at once
    late_fork = engine.fork(late)
    engine.drain(advance_time=False)
    assert engine.wait(late_fork, timeout=5) == "rested"


def test_a_child_pending_at_the_fork_point_is_started_again_as_a_new_child_of_the_fork(make_engine: Any) -> None:
    v1 = _v1(make_engine)
    run_id = v1.start_workflow(parent)
    v1.drain()
    assert v1.get_run(run_id).status is dex.RunStatus.FAILED
    (old_child,) = [item.event.child_run_id for item in v1.history(run_id) if item.kind == "ChildRunCreated"]  # type: ignore[union-attr]
    v2 = _v2(make_engine)
    fork_id = v2.fork(run_id)
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == ["charged first", "charged second"]
    children = [item.event.child_run_id for item in v2.history(fork_id) if item.kind == "ChildRunCreated"]  # type: ignore[union-attr]
    assert len(children) == 2 and old_child not in children
    assert {v2.get_run(child).parent_run_id for child in children} == {fork_id}
    assert v2.get_run(old_child).status is dex.RunStatus.FAILED  # the original's child is left alone
    assert v2.get_run(old_child).parent_run_id == run_id


def test_a_child_that_finished_before_the_fork_point_is_not_run_again(make_engine: Any) -> None:
    v1 = _v1(make_engine)
    run_id = v1.start_workflow(two_children)
    v1.drain()
    assert v1.get_run(run_id).status is dex.RunStatus.FAILED
    assert CALLS["reserve"] == 1
    v2 = _v2(make_engine)
    fork_id = v2.fork(run_id)
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == ["reserved first", "charged second"]
    assert CALLS["reserve"] == 1  # the first child's result was recorded before the fork point
    old = [e.event.child_run_id for e in v2.history(run_id) if e.kind == "ChildRunCreated"]  # type: ignore[union-attr]
    new = [e.event.child_run_id for e in v2.history(fork_id) if e.kind == "ChildRunCreated"]  # type: ignore[union-attr]
    assert new[0] == old[0] and new[1] != old[1]


def test_events_received_after_the_fork_point_are_delivered_to_the_fork_again(make_engine: Any) -> None:
    v1 = _v1(make_engine)
    run_id = v1.start_workflow(gate)
    v1.drain()
    waiting = _kinds(v1, run_id).index("WorkflowTaskCompleted") + 1  # the end of the task that waits
    v1.send_event(run_id, "go", "parcel")
    v1.drain()
    assert v1.get_run(run_id).status is dex.RunStatus.FAILED
    v2 = _v2(make_engine)
    fork_id = v2.fork(run_id, at=waiting)
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "charged parcel"


def test_a_fork_keeps_the_instance_id_and_is_refused_while_a_live_run_holds_it(make_engine: Any) -> None:
    v1 = _v1(make_engine)
    failed = v1.start_workflow(order, "book", instance_id="order-7")
    v1.drain()
    v2 = _v2(make_engine)
    fork_id = v2.fork(failed)
    assert v2.get_run(fork_id).instance_id == "order-7"
    assert v2.start_workflow(order, "book", instance_id="order-7") == fork_id  # the live run of the instance
    before = len(v2.list_runs())
    with pytest.raises(dex.InvalidStateError, match=f"instance id 'order-7' is in use by run {fork_id}"):
        v2.fork(failed)
    assert len(v2.list_runs()) == before  # nothing written
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "reserved book, charged book"


def test_a_fork_goes_on_the_queue_it_is_given(make_engine: Any) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)
    fork_id = v2.fork(run_id, queue="repairs")
    assert v2.store.get_run(fork_id).queue == "repairs"  # type: ignore[union-attr]
    assert "repairs" in {queue.name for queue in v2.list_queues() if queue.kind == "workflow"}
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "reserved book, charged book"


def test_fork_async(make_engine: Any) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)
    fork_id = asyncio.run(v2.fork_async(run_id))
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == "reserved book, charged book"
    assert v2.get_run(fork_id).forked_from == run_id


@pytest.mark.parametrize(
    ("at", "error", "complaint"),
    [
        (0, ValueError, "at must be a sequence number"),
        (-3, ValueError, "at must be a sequence number"),
        (10_000, ValueError, "beyond the history"),
        (2, ValueError, "is not the end of a workflow task (event 2 is WorkflowTaskStarted); run "),
        ("last", ValueError, "ends the workflow task that ended the run; run "),
        (True, TypeError, "at must be an int"),
        ("5", TypeError, "at must be an int"),
        (5.0, TypeError, "at must be an int"),
    ],
)
def test_a_bad_fork_point_is_refused_naming_the_problem_and_nothing_is_written(
    make_engine: Any, at: Any, error: type[Exception], complaint: str
) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)
    if at == "last":
        at = len(v2.history(run_id))  # the WorkflowTaskCompleted of the task that failed the run
    before = len(v2.list_runs())
    with pytest.raises(error) as raised:
        v2.fork(run_id, at=at)
    assert complaint in str(raised.value)
    if complaint.endswith("; run "):  # where it can be forked instead
        assert str(raised.value).endswith(f"run {run_id} can be forked at 1, 5, 9, 13")
    assert len(v2.list_runs()) == before
    _completes(v2)


@pytest.mark.parametrize(
    ("run_id", "queue", "error", "complaint"),
    [
        ("00000000-0000-4000-8000-000000000000", None, dex.RunNotFoundError, "no run with id"),
        ("run\x00id", None, ValueError, "run_id"),
        ("run\ud800", None, ValueError, "run_id"),
        (None, "bad queue!", ValueError, "invalid queue name"),
        (None, "q\x00", ValueError, "invalid queue name"),
        (None, "q\ud800", ValueError, "invalid queue name"),
        (None, 7, ValueError, "invalid queue name"),
    ],
)
def test_a_bad_run_id_or_queue_is_refused_and_nothing_is_written(
    make_engine: Any, run_id: str | None, queue: Any, error: type[Exception], complaint: str
) -> None:
    original = _failed_order(make_engine)
    v2 = _v2(make_engine)
    target = run_id if run_id is not None else original
    if error is dex.RunNotFoundError:
        with pytest.raises(error) as by_get_run:
            v2.get_run(target)
        complaint = str(by_get_run.value)  # the very error get_run gives
    before = len(v2.list_runs())
    with pytest.raises(error) as raised:
        v2.fork(target, queue=queue)
    assert complaint in str(raised.value)
    assert len(v2.list_runs()) == before
    _completes(v2)


class _Unplugged(BaseException):
    """Something that is not even an Exception, raised while the fork is being written."""


@pytest.mark.parametrize("fault", [ConnectionError("the store went away mid-fork"), _Unplugged("unplugged")])
def test_a_store_failing_mid_fork_leaves_nothing_half_written(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    v1 = _v1(make_engine)
    run_id = v1.start_workflow(two_children)
    v1.drain()
    v2 = _v2(make_engine)
    runs_before = {info.run_id for info in v2.list_runs()}
    _fail_after_writing_the_copy(v2.store, monkeypatch, fault)
    with pytest.raises(type(fault), match=str(fault)):
        v2.fork(run_id)
    monkeypatch.undo()
    assert {info.run_id for info in v2.list_runs()} == runs_before  # neither the fork nor its new child
    v2.drain()
    assert CALLS == {"reserve": 1, "charge": 1}  # no activity task of the fork was left behind
    _completes(v2)
    fork_id = v2.fork(run_id)  # and the fork, tried again, is whole
    v2.drain()
    assert v2.wait(fork_id, timeout=5) == ["reserved first", "charged second"]


def _fail_after_writing_the_copy(store: Any, monkeypatch: pytest.MonkeyPatch, fault: BaseException) -> None:
    """Make the store fail once the fork's run, history, children and tasks are written, before
    the write ends (memory: inside its lock; PostgreSQL: inside its transaction)."""
    if isinstance(store, InMemoryAdapter):
        real = MemoryTasks.complete_workflow_task

        def failing_memory(*args: Any) -> bool:
            real(*args)
            raise fault

        monkeypatch.setattr(MemoryTasks, "complete_workflow_task", failing_memory)
        return
    from dex.adapters.postgres import completion

    real_pg = completion.complete_workflow_tasks

    def failing_pg(*args: Any) -> list[bool]:
        real_pg(*args)
        raise fault

    monkeypatch.setattr(completion, "complete_workflow_tasks", failing_pg)


def test_a_started_engine_runs_the_fork_it_makes(make_engine: Any) -> None:
    run_id = _failed_order(make_engine)
    v2 = _v2(make_engine)
    v2.start()  # its threads, not drain, pick up the fork's activity task and its next tasks
    fork_id = v2.fork(run_id)
    assert v2.wait(fork_id, timeout=15) == "reserved book, charged book"
    assert CALLS == {"reserve": 1, "charge": 2}


def test_forks_racing_for_one_instance_id_make_exactly_one_run(make_engine: Any) -> None:
    v1 = _v1(make_engine)
    failed = v1.start_workflow(order, "book", instance_id="order-race")
    v1.drain()
    v2 = _v2(make_engine)
    before = len(v2.list_runs())
    barrier = threading.Barrier(3)
    outcomes: list[object] = []

    def fork() -> None:
        barrier.wait()
        try:
            outcomes.append(v2.fork(failed))
        except dex.InvalidStateError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=fork) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    forks = [o for o in outcomes if isinstance(o, str)]
    assert len(outcomes) == 3 and len(forks) == 1  # the others were refused: the instance id is taken
    assert all("instance id 'order-race' is in use" in str(o) for o in outcomes if not isinstance(o, str))
    assert len(v2.list_runs()) == before + 1
    v2.drain()
    assert v2.wait(forks[0], timeout=5) == "reserved book, charged book"
