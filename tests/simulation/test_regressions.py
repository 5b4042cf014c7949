"""Regression tests for engine bugs the simulator found (all fixed).

Every bug has a minimal reproduction on the plain engine (over every adapter where the bug
lived in both) and a simulation, at a seed that found it, that must stay green.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain import events as ev
from dex.domain.state import fold
from dex.domain.status import RunStatus
from dex.simulation import FAULT_KINDS, Fault, SimulationFailure, Simulator, Workload
from dex.simulation.conversation_workload import CONVERSATION_WORKLOAD
from dex.testing import VirtualClock


@dex.workflow(name="known-again")
async def again(ctx: dex.WorkflowContext, n: int) -> int:
    """Wait for "go"; continue as new until ``n`` reaches 1, then return it."""
    await ctx.wait_for_event("go")
    if n > 1:
        ctx.continue_as_new(n - 1)
    return n


def expect_simulation_failure(simulator: Simulator, invariants: set[str]) -> None:
    """Re-raise the simulator's failure if it is the known one; anything else is a new bug."""
    try:
        simulator.run()
    except SimulationFailure as failure:
        found = getattr(failure.cause, "invariant", type(failure.cause).__name__)
        if found not in invariants:
            pytest.fail(f"a different failure than the known bug: {failure}")
        raise


# -- 1. a cancel or suspend accepted while a continue-as-new task is in flight is lost --------------
#
# The store applies the continue-as-new result by keeping only ExternalEventReceived messages
# in the inbox (memory: store.py _complete_workflow_task; PostgreSQL: completion.py, "DELETE
# FROM inbox WHERE kind <> 'ExternalEventReceived'"). A RunCancelled or RunSuspended that
# arrived after the task loaded its inbox goes with them: the cancel was accepted and is never
# honoured; the suspend leaves the store SUSPENDED while the history never says so, and the
# later RunResumed makes a history that ``fold`` rejects (RUNNING -> RUNNING).

BUG_1 = "a cancel or suspend accepted during a continue-as-new task is dropped with the old generation's messages"


def _request_during_continue_as_new(make_engine: Callable[..., dex.Engine], request: str) -> tuple[dex.Engine, str]:
    worker = make_engine(workflows=[again])
    client = make_engine(workflows=[again])
    run_id = client.start_workflow(again, 2)
    worker.drain()
    client.send_event(run_id, "go")
    worker.workflow_scheduler.step()
    assert worker.workflow_worker.poll_once() == 1  # decided: continue as new; not yet written
    getattr(client, request)(run_id)  # accepted: the run is live
    worker.buffer.flush()  # the new generation begins
    if request == "suspend":
        client.resume(run_id)
    client.send_event(run_id, "go")
    worker.drain()
    return client, run_id


def test_a_cancel_accepted_during_continue_as_new_ends_the_run_cancelled(
    make_engine: Callable[..., dex.Engine],
) -> None:
    client, run_id = _request_during_continue_as_new(make_engine, "cancel")
    assert client.get_run(run_id).status is RunStatus.CANCELLED  # it COMPLETED: the cancel was lost


def test_a_suspend_accepted_during_continue_as_new_reaches_the_history(
    make_engine: Callable[..., dex.Engine],
) -> None:
    client, run_id = _request_during_continue_as_new(make_engine, "suspend")
    history = client.history(run_id)
    assert any(isinstance(item.event, ev.RunSuspended) for item in history)
    fold(history)  # raises InvalidStateError: a run cannot go from RUNNING to RUNNING


@pytest.mark.parametrize("seed", [0, 307])
def test_simulation_with_requests_to_continuing_runs(seed: int) -> None:
    simulator = Simulator(seed, workload=Workload(control_continuing_runs=True))
    expect_simulation_failure(simulator, {"history-folds", "requests-honoured"})


# -- 2. the executor cache trusts an executor whose own result was never written ------------------
#
# A worker caches its executor when it decides a task, before the result is written. If its
# lease runs out before its buffer is flushed (a stalled write path), another worker redoes
# the task; if the history reaches the same position, the first worker's next task of that
# run takes its cached executor, which holds its own unwritten decisions (here a side effect's
# value). The run then returns a value its history does not record.

BUG_2 = "ExecutorCache trusts an executor whose result was not yet written when another worker redid the task"

_draws = itertools.count(1)


@dex.workflow(name="known-token")
async def token(ctx: dex.WorkflowContext) -> int:
    drawn: int = ctx.side_effect("token", lambda: next(_draws))
    await ctx.wait_for_event("go")
    return drawn


def test_a_cached_executor_whose_result_was_not_written_is_not_reused() -> None:
    clock = VirtualClock()
    store = InMemoryAdapter(clock=clock)
    a = dex.Engine(store, workflows=[token])
    b = dex.Engine(store, workflows=[token])
    run_id = a.start_workflow(token)
    a.workflow_scheduler.step()
    (task,) = store.claim_workflow_tasks({"known-token"}, a.node_id, clock.now(), timedelta(seconds=60), 1)
    unwritten = a.workflow_worker.execute(task)  # A draws a token and caches its executor
    assert unwritten is not None
    clock.advance(61)  # A's write stalls past its lease
    b.drain(advance_time=False)  # B redoes the task and draws another token, which is recorded
    a.send_event(run_id, "go")
    a.workflow_scheduler.step()
    a.workflow_worker.poll_once()  # A decides the next task with its own executor
    a.buffer.add_workflow_result(task, unwritten)  # (discarded when it is finally written)
    a.drain()
    recorded = next(item.event for item in a.history(run_id) if isinstance(item.event, ev.SideEffectExecuted))
    assert a.get_run(run_id).result == a.converter.decode(recorded.result)


@pytest.mark.parametrize("seed", [28, 99])
def test_simulation_deciding_while_a_result_is_unwritten(seed: int) -> None:
    kinds = itertools.cycle(["flush-stall", "lease-expiry", "write-fails"])
    faults = [Fault(step, kind, step) for step, kind in zip(range(10, 300, 15), kinds, strict=False)]
    simulator = Simulator(seed, faults)
    expect_simulation_failure(simulator, {"replays-deterministically", "every-run-ends"})


# -- 3. a suspend raced by a task that ran activities inline ---------------------------------------
#
# Found when the simulator began to run eager dispatch with inline activities: a workflow task
# handed over with its input loaded at T ran an activity inline after a suspend was accepted
# at T, and its inline block (stamped later) ended the run. The task started no later than the
# request, so the run rightly ended first; the referee had taken the inline block for a task.


def test_a_request_raced_by_a_task_with_inline_blocks_counts_from_the_tasks_start() -> None:
    faults = [
        Fault(16, "flush-stall", 6),
        Fault(75, "hang", 5),
        Fault(81, "flush-stall", 1),
        Fault(96, "activity-fails", 1),
        Fault(98, "hang", 6),
        Fault(111, "hang", 2),
        Fault(126, "leader-loss", 4),
        Fault(164, "flush-stall", 2),
        Fault(202, "store-flaky", 3),
        Fault(231, "lease-expiry", 4),
        Fault(296, "hang", 3),
    ]
    report = Simulator(229272273, faults, inline=True).run()
    assert report.outcomes  # every run ended, and every invariant held


# -- 4. an event reserved for a wait that is never awaited is lost ----------------------------------
#
# ``ctx.wait_for_event`` made while an event of its id is buffered reserves that event for the
# wait at once. A wait made and never awaited (kept for later, as a loser of ``ctx.first`` is
# re-made for the next round) held its event outside the buffer, so the run counted it neither
# read nor unread (``RunInfo.unread_events`` too low), and continue-as-new, which carries the
# unread events into the next generation, dropped it. Found by the conversation workload
# (``sim-race``): four pings received, one read, two counted unread.


@dex.workflow(name="known-reserved")
async def reserved(ctx: dex.WorkflowContext, generation: int) -> list[int]:
    if generation == 1:
        await ctx.wait_for_event("go")
        ctx.wait_for_event("ping")  # made, never awaited: the first ping is reserved for it
        ctx.continue_as_new(2)
    return [await ctx.wait_for_event("ping"), await ctx.wait_for_event("ping")]


@dex.workflow(name="known-unawaited")
async def unawaited(ctx: dex.WorkflowContext) -> str:
    await ctx.wait_for_event("go")
    ctx.wait_for_event("ping")
    return "done"


def test_an_event_reserved_for_a_wait_never_awaited_goes_on_to_the_next_generation(
    make_engine: Callable[..., dex.Engine],
) -> None:
    engine = make_engine(workflows=[reserved])
    run_id = engine.start_workflow(reserved, 1)
    engine.drain()
    for event_id, payload in (("ping", 1), ("ping", 2), ("go", None)):
        engine.send_event(run_id, event_id, payload)
    engine.drain()
    assert engine.get_run(run_id).status is RunStatus.COMPLETED  # it waited for a third ping
    assert engine.wait(run_id, timeout=5) == [1, 2]  # it got only 2


def test_an_event_reserved_for_a_wait_never_awaited_counts_unread(make_engine: Callable[..., dex.Engine]) -> None:
    engine = make_engine(workflows=[unawaited])
    run_id = engine.start_workflow(unawaited)
    engine.drain()
    engine.send_event(run_id, "ping", 1)
    engine.send_event(run_id, "go")
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "done"
    assert engine.get_run(run_id).unread_events == 1  # it was 0


def test_simulation_with_waits_kept_for_a_later_round() -> None:
    faults = [Fault(10 + 20 * i, kind, i) for i, kind in enumerate(sorted(FAULT_KINDS))]
    simulator = Simulator(9, faults, steps=400, max_runs=6, workload=CONVERSATION_WORKLOAD)
    simulator.run()  # it failed with events-not-taken-by-losers
