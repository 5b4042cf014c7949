"""Short activity leases, kept alive by the engine that runs the attempt (docs/reference/contract.md §8).

An activity task is claimed under ``min(lock_timeout, Engine(activity_lease=...))``; while the
attempt runs, its engine's activity thread extends that lease (``ActivityWorker.keep_leases``,
called here by hand where a started engine calls it every round); ``lock_timeout`` bounds one
attempt, counted from its start or its last ``heartbeat()``. So the task of a worker that
died is taken over within the short lease, however long its ``lock_timeout``, and a live
worker keeps its task as long as the attempt needs, up to ``lock_timeout``.

The attempts run in a thread of their own, as in a started engine's pool, held at a gate
while the test moves the virtual clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.app.ports.store import ActivityTask
from dex.testing import VirtualClock

SHORT = timedelta(seconds=30)
GATE = threading.Event()  # the held attempt returns once it is set
STARTED = threading.Event()
BEATS: list[bool] = []  # what heartbeat() said after the gate opened


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    GATE.clear()
    STARTED.clear()
    BEATS.clear()
    yield
    GATE.set()  # no held attempt outlives its test


def _held_attempt() -> str:
    ctx = dex.activity_context()
    if ctx.attempt == 1:
        STARTED.set()
        assert GATE.wait(30)
        BEATS.append(ctx.heartbeat())
    return f"attempt {ctx.attempt}"


@dex.activity(name="long-lock", lock_timeout=timedelta(minutes=5), retry=dex.RetryPolicy(max_attempts=3))
def long_lock() -> str:
    return _held_attempt()


@dex.activity(name="minute-lock", lock_timeout=timedelta(seconds=60), retry=dex.RetryPolicy(max_attempts=2))
def minute_lock() -> str:
    return _held_attempt()


@dex.activity(name="only-once", lock_timeout=timedelta(seconds=60), retry=dex.RetryPolicy(max_attempts=1))
def only_once() -> str:
    return _held_attempt()


@dex.activity(name="brief-lock", lock_timeout=timedelta(seconds=10))
def brief_lock() -> str:
    return "brief"


@dex.workflow(name="calls")
async def calls(ctx: dex.WorkflowContext, activity: str) -> str:
    try:
        return await ctx.activity(activity)  # type: ignore[no-any-return]
    except dex.ActivityFailedError as exc:
        return f"failed: {exc.failure.type}"


ACTIVITIES = [long_lock, minute_lock, only_once, brief_lock]


def _claimed(engine: dex.Engine, activity: str) -> tuple[str, ActivityTask]:
    """Start a run of ``calls(activity)`` and claim its activity task on ``engine``."""
    run_id = engine.start_workflow(calls, activity)
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    (task,) = engine.activity_worker.claim()
    return run_id, task


def _run_in_thread(engine: dex.Engine, task: ActivityTask) -> threading.Thread:
    """Run the attempt as a started engine's pool does, and wait until it is under way."""
    runner = threading.Thread(target=engine.activity_worker.run, args=(task,), daemon=True)
    runner.start()
    assert STARTED.wait(10)
    return runner


def test_a_claim_takes_the_short_lease_at_most_lock_timeout(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    _run_id, task = _claimed(engine, "long-lock")
    assert task.lease.until == clock.now() + SHORT  # not the 5 minutes of its lock_timeout
    _run_id, brief = _claimed(engine, "brief-lock")
    assert brief.lease.until == clock.now() + timedelta(seconds=10)  # its lock_timeout is shorter
    # a heartbeat extends by the short lease too
    clock.advance(timedelta(seconds=20))
    assert engine.buffer.heartbeat(task)
    assert engine.store.extend_activity_leases([task], clock.now(), SHORT) == [True]
    rival = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    clock.advance(SHORT - timedelta(seconds=1))
    assert task.task_id not in {t.task_id for t in rival.activity_worker.claim()}  # (brief's lease lapsed)
    clock.advance(timedelta(seconds=2))
    assert [t.task_id for t in rival.activity_worker.claim()] == [task.task_id]


def test_the_task_of_a_dead_worker_is_taken_over_within_the_short_lease(make_engine: Any, clock: VirtualClock) -> None:
    dead = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    run_id, task = _claimed(dead, "long-lock")  # then the process dies: nobody extends the lease
    survivor = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    clock.advance(SHORT - timedelta(seconds=1))
    assert survivor.activity_worker.claim() == []
    clock.advance(timedelta(seconds=1))
    (taken,) = survivor.activity_worker.claim()  # 30 s after the claim, not 5 minutes
    assert (taken.task_id, taken.attempt) == (task.task_id, 2)
    survivor.activity_worker.run(taken)
    survivor.drain()
    assert survivor.wait(run_id, timeout=5) == "attempt 2"


def test_a_live_engine_keeps_its_attempt_past_the_short_lease(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    run_id, task = _claimed(engine, "long-lock")
    runner = _run_in_thread(engine, task)
    rival = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    for _ in range(24):  # four minutes, eight short leases, in steps of 10 s
        clock.advance(timedelta(seconds=10))
        engine.activity_worker.keep_leases()  # what the activity thread does every round
        assert rival.activity_worker.claim() == []  # nobody else can claim it
    GATE.set()
    runner.join(10)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "attempt 1"
    assert BEATS == [True]
    assert engine.buffer.discarded == 0


def test_an_attempt_past_its_lock_timeout_fails_and_is_retried(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    healthy_run, healthy = _claimed(engine, "brief-lock")
    run_id, task = _claimed(engine, "minute-lock")
    runner = _run_in_thread(engine, task)
    for _ in range(5):  # 50 s: within its lock_timeout of 60 s
        clock.advance(timedelta(seconds=10))
        engine.activity_worker.keep_leases()
    assert engine.store.get_run(run_id).status is dex.RunStatus.RUNNING
    clock.advance(timedelta(seconds=10))
    assert engine.activity_worker.keep_leases() == 1  # at 60 s: failed at once, retried later
    engine.buffer.flush()
    GATE.set()  # the attempt goes on regardless; what it returns now is discarded
    runner.join(10)
    assert BEATS == [False]  # its lease was given up: heartbeat() says so
    engine.activity_worker.run(healthy)  # the attempt of another run is not affected
    engine.drain()  # the retry, once its delay has passed
    assert engine.wait(run_id, timeout=5) == "attempt 2"
    assert engine.wait(healthy_run, timeout=5) == "brief"
    assert engine.buffer.discarded == 1  # the late result of attempt 1


def test_an_attempt_past_its_lock_timeout_on_its_last_attempt_fails_the_activity(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    run_id, task = _claimed(engine, "only-once")
    runner = _run_in_thread(engine, task)
    for _ in range(6):
        clock.advance(timedelta(seconds=10))
        engine.activity_worker.keep_leases()
    GATE.set()
    runner.join(10)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "failed: LockTimeoutError"
    [failed] = [e.event for e in engine.history(run_id) if e.kind == "ActivityTaskFailed"]
    assert "ran longer than its lock_timeout (0:01:00)" in failed.failure.message  # type: ignore[attr-defined]


def test_a_lost_lease_is_reported_by_heartbeat(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    run_id, task = _claimed(engine, "long-lock")
    runner = _run_in_thread(engine, task)
    clock.advance(SHORT + timedelta(seconds=1))  # the engine stalled: no extension in time
    rival = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    (taken,) = rival.activity_worker.claim()
    assert taken.attempt == 2
    engine.activity_worker.keep_leases()  # the extension is refused: the lease is lost
    GATE.set()
    runner.join(10)
    assert BEATS == [False]
    rival.activity_worker.run(taken)
    rival.buffer.flush()
    engine.drain()
    assert engine.wait(run_id, timeout=5) == "attempt 2"
    assert engine.buffer.discarded == 1  # attempt 1's late result


def test_a_lost_last_attempt_fails_with_lease_expired_within_the_short_lease(
    make_engine: Any, clock: VirtualClock
) -> None:
    dead = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    run_id, _task = _claimed(dead, "only-once")
    survivor = make_engine([calls], ACTIVITIES, activity_lease=SHORT)
    clock.advance(SHORT)
    survivor.drain(advance_time=False)
    assert survivor.wait(run_id, timeout=5) == "failed: LeaseExpiredError"
    assert not STARTED.is_set()  # the policy allowed one attempt: nothing ran again


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-1), 30, None])
def test_the_activity_lease_must_be_a_positive_timedelta(make_engine: Any, lease: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="activity_lease"):
        make_engine([calls], ACTIVITIES, activity_lease=lease)
