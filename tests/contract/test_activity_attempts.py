"""A run's activity steps with their attempts (``Engine.activity_steps``), on every adapter.

docs/reference/contract.md §8: retried attempts are not history, so the store keeps each step's
failed attempts with the retry that reschedules it, and its lost attempts (begun, never
reported: the lease expired) with the claim that takes it over. A step shows how many attempts
began, the newest failures (bounded, each with its time and failure), the next retry's time
while it retries, and the attempts lost to a crash. A failure whose text is hostile is kept
bounded and readable, and the runs after it go on.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.app.ports.attempts import FAILED, LEASE_EXPIRED, LOST, MAX_RECENT_ATTEMPTS
from dex.app.runtime.options import RuntimeOptions
from dex.domain.values import MAX_FAILURE_TEXT
from dex.testing import VirtualClock

FAST = dex.RetryPolicy(initial_delay=timedelta(seconds=1), randomization_factor=0, max_attempts=10)


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Stop(BaseException):
    """A BaseException that is not an Exception: still a failed attempt."""


@dex.activity(name="flaky", retry=FAST)
def flaky(failures: int) -> str:
    attempt = dex.activity_context().attempt
    if attempt <= failures:
        raise ConnectionError(f"gateway timeout on attempt {attempt}")
    return f"ok after {attempt}"


@dex.activity(name="doomed", retry=dex.RetryPolicy(initial_delay=timedelta(seconds=1), max_attempts=3))
def doomed() -> str:
    raise ValueError(f"declined {dex.activity_context().attempt}")


@dex.activity(name="slow-retry", retry=dex.RetryPolicy(initial_delay=timedelta(minutes=5), randomization_factor=0))
def slow_retry() -> str:
    if dex.activity_context().attempt == 1:
        raise TimeoutError("upstream busy")
    return "done"


@dex.activity(name="poison", retry=FAST)
def poison() -> str:
    attempt = dex.activity_context().attempt
    if attempt == 1:
        raise Hostile()
    if attempt == 2:
        raise RuntimeError("nul \x00 and a lone \ud800 surrogate " + "y" * 100_000)
    if attempt == 3:
        raise Stop("a BaseException")
    return "survived"


@dex.activity(name="held", lock_timeout=timedelta(minutes=5), retry=FAST)
def held() -> str:
    return f"attempt {dex.activity_context().attempt}"


@dex.workflow(name="one-step")
async def one_step(ctx: dex.WorkflowContext, activity: str, *args: Any) -> str:
    try:
        return await ctx.activity(activity, *args)  # type: ignore[no-any-return]
    except dex.ActivityFailedError as exc:
        return f"failed: {exc.failure.message}"


ACTIVITIES = [flaky, doomed, slow_retry, poison, held]


def _engine(make_engine: Any) -> dex.Engine:
    engine: dex.Engine = make_engine([one_step], ACTIVITIES)
    return engine


def test_a_step_that_succeeds_at_once_shows_one_attempt_and_nothing_else(make_engine: Any) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(one_step, "flaky", 0)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "ok after 1"
    (step,) = engine.activity_steps(run_id)
    assert (step.name, step.status, step.attempts, step.failed, step.lost, step.recent) == (
        "flaky",
        "completed",
        1,
        0,
        0,
        (),
    )
    assert step.ended_at is not None and step.next_retry_at is None
    assert engine.store.step_attempts(run_id) == []  # nothing was written for it
    assert asyncio.run(engine.activity_steps_async(run_id)) == [step]


def test_failed_attempts_are_counted_and_the_newest_kept(make_engine: Any) -> None:
    engine = _engine(make_engine)
    failures = MAX_RECENT_ATTEMPTS + 2
    run_id = engine.start_workflow(one_step, "flaky", failures)
    engine.drain()
    assert engine.wait(run_id, timeout=0) == f"ok after {failures + 1}"
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed, step.lost) == ("completed", failures + 1, failures, 0)
    assert [a.attempt for a in step.recent] == list(range(failures, failures - MAX_RECENT_ATTEMPTS, -1))
    assert all(a.kind == FAILED and a.failure.type == "ConnectionError" for a in step.recent)
    assert step.recent[0].failure.message == f"gateway timeout on attempt {failures}"
    times = [a.at for a in step.recent]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)


def test_a_step_that_fails_shows_its_final_failure_with_the_others(make_engine: Any) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(one_step, "doomed")
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "failed: declined 3"
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed) == ("failed", 3, 3)
    assert [(a.attempt, a.failure.message) for a in step.recent] == [
        (3, "declined 3"),
        (2, "declined 2"),
        (1, "declined 1"),
    ]


def test_a_step_still_retrying_shows_when_it_retries(make_engine: Any, clock: VirtualClock) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(one_step, "slow-retry")
    failed_at = clock.now()
    engine.drain(advance_time=False)  # attempt 1 fails; the retry waits five minutes
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed) == ("retrying", 1, 1)
    assert step.next_retry_at == failed_at + timedelta(minutes=5)
    (only,) = step.recent
    assert (only.attempt, only.at, only.failure.type, only.failure.message) == (
        1,
        failed_at,
        "TimeoutError",
        "upstream busy",
    )
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "done"
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed, step.next_retry_at) == ("completed", 2, 1, None)


def test_an_attempt_lost_to_a_crash_is_shown_as_lost(make_engine: Any, clock: VirtualClock) -> None:
    lease = timedelta(seconds=30)
    dead = make_engine([one_step], ACTIVITIES, activity_lease=lease)
    run_id = dead.start_workflow(one_step, "held")
    dead.workflow_scheduler.step()
    dead.workflow_worker.poll_once()
    dead.buffer.flush()
    dead.activity_scheduler.step()
    (task,) = dead.activity_worker.claim()  # then the process dies: nobody reports or extends
    (running,) = dead.activity_steps(run_id)
    assert (running.status, running.attempts, running.lease_expires_at) == ("running", 1, task.lease.until)
    clock.advance(lease)
    survivor = make_engine([one_step], ACTIVITIES, activity_lease=lease)
    (taken,) = survivor.activity_worker.claim()
    assert taken.attempt == 2
    survivor.activity_worker.run(taken)
    survivor.drain()
    assert survivor.wait(run_id, timeout=5) == "attempt 2"
    (step,) = survivor.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed, step.lost) == ("completed", 2, 0, 1)
    (lost,) = step.recent
    assert (lost.attempt, lost.kind, lost.at, lost.failure.type) == (1, LOST, task.lease.until, LEASE_EXPIRED)


def test_hostile_failures_are_kept_clear_and_bounded_and_the_next_run_is_healthy(make_engine: Any) -> None:
    engine = _engine(make_engine)
    run_id = engine.start_workflow(one_step, "poison")
    engine.drain()
    assert engine.wait(run_id, timeout=0) == "survived"
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed) == ("completed", 4, 3)
    stop, text, unprintable = step.recent
    assert (unprintable.attempt, unprintable.failure.type) == (1, "Hostile")
    assert "__str__ raised RuntimeError" in unprintable.failure.message
    assert text.failure.type == "RuntimeError"
    # stored as FailureInfo keeps any text: the NUL as it is, the lone surrogate as a visible escape
    assert text.failure.message.startswith("nul \x00 and a lone \\ud800 surrogate y")
    assert "\ud800" not in text.failure.message and "[truncated: " in text.failure.message
    assert len(text.failure.message) <= MAX_FAILURE_TEXT
    assert (stop.failure.type, stop.failure.message) == ("Stop", "a BaseException")
    healthy = engine.start_workflow(one_step, "flaky", 1)
    engine.drain()
    assert engine.wait(healthy, timeout=0) == "ok after 2"
    (after,) = engine.activity_steps(healthy)
    assert (after.attempts, after.failed) == (2, 1)


def test_an_inline_first_attempt_that_fails_is_kept_too(make_engine: Any, clock: VirtualClock) -> None:
    # drain runs first attempts inline as a started engine does, the activity known to be short
    engine = make_engine([one_step], ACTIVITIES, runtime_options=RuntimeOptions(drain_inline=60.0, slots_ttl=0))
    engine.activity_worker.durations.record("slow-retry", 0.001)
    run_id = engine.start_workflow(one_step, "slow-retry")
    engine.drain(advance_time=False)
    (step,) = engine.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed) == ("retrying", 1, 1)
    assert [(a.attempt, a.failure.message) for a in step.recent] == [(1, "upstream busy")]
    assert step.next_retry_at == clock.now() + timedelta(minutes=5)


def test_steps_of_an_unknown_run_are_refused(make_engine: Any) -> None:
    engine = _engine(make_engine)
    with pytest.raises(dex.RunNotFoundError):
        engine.activity_steps("no-such-run")


@dex.activity(name="last-chance", lock_timeout=timedelta(minutes=5), retry=dex.RetryPolicy(max_attempts=1))
def last_chance() -> str:
    return "never reported"


def test_a_step_whose_last_allowed_attempt_is_lost_fails_with_that_attempt_lost(
    make_engine: Any, clock: VirtualClock
) -> None:
    lease = timedelta(seconds=30)
    dead = make_engine([one_step], [last_chance], activity_lease=lease)
    run_id = dead.start_workflow(one_step, "last-chance")
    dead.workflow_scheduler.step()
    dead.workflow_worker.poll_once()
    dead.buffer.flush()
    dead.activity_scheduler.step()
    (task,) = dead.activity_worker.claim()  # its only attempt; then the process dies
    clock.advance(lease)
    survivor = make_engine([one_step], [last_chance], activity_lease=lease)
    survivor.drain()  # the takeover finds no attempt left: the step fails
    assert survivor.wait(run_id, timeout=5).startswith("failed: attempt 1 of activity 'last-chance' lost its lease")
    (step,) = survivor.activity_steps(run_id)
    assert (step.status, step.attempts, step.failed, step.lost) == ("failed", 1, 0, 1)
    (lost,) = step.recent  # the lost attempt, not a second entry for the failure it caused
    assert (lost.attempt, lost.kind, lost.at) == (1, LOST, task.lease.until)
