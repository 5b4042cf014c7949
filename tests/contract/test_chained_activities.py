"""Chained activities (``Engine(chained_activity_seconds=...)``, :mod:`dex.app.workflows.inline`) on a
started engine, on every adapter.

An activity that ran as a task of its own is answered in its attempt's thread; that thread
then goes on with the run's next activities that typically take up to the chained limit (a
call to a service: tens of milliseconds), one after the other, and the steps are written
together. These tests check that it happens and that the history replays; that the limit
(and ``inline_activity_seconds=0``) turns it off; that a step whose claim was taken over runs
nothing chained; and the poisons: a chained attempt raising what cannot be printed or a
``BaseException``, a result that cannot be stored, NUL and lone surrogates, the store failing
the write that carries a chain. Each ends with a healthy run that completes.

Each activity's duration is recorded by hand before the engine starts (20 ms: too slow to run
in the workflow thread, quick enough to chain), and the chained limit is generous, so what
chains does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.app.ports.store import ActivityTask, AnsweredStep
from dex.app.workflows import worker as workflow_worker
from dex.domain import events as ev
from dex.testing import VirtualClock

attempts: list[tuple[str, int]] = []
_lock = threading.Lock()


def _attempted(name: str) -> None:
    with _lock:
        attempts.append((name, dex.activity_context().attempt))
    time.sleep(0.01)  # too slow for the workflow thread (inline_activity_seconds=0.005)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@dex.activity
def step(x: int) -> int:
    _attempted("step")
    return x + 1


@dex.activity
def echo(text: str) -> str:
    _attempted("echo")
    return text


@dex.activity
def poisoned(text: str) -> str:
    _attempted("poisoned")
    return text + " \udc80"  # a result that cannot be stored: the attempt's own failure


_QUICK_RETRY = dex.RetryPolicy(initial_delay=timedelta(milliseconds=50), randomization_factor=0, max_attempts=3)


@dex.activity(retry=_QUICK_RETRY)
def hostile(kind: str) -> str:
    """Raises on its first attempt (what ``kind`` says), returns on the next."""
    _attempted("hostile")
    if dex.activity_context().attempt == 1:
        if kind == "unprintable":
            raise Unprintable()
        if kind == "interrupt":
            raise KeyboardInterrupt("raised by a chained activity")
        raise SystemExit(3)
    return f"{kind} survived"


@dex.activity
async def awaited(x: int) -> int:
    """An ``async def`` activity: its attempt as a task is awaited on the engine's loop."""
    _attempted("awaited")  # (its 10 ms sleep blocks the loop briefly; fine for a test)
    await asyncio.sleep(0.005)
    return x + 1


@dex.workflow
async def awaits(ctx: dex.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.activity(awaited, x)
    return x


@dex.workflow
async def steps(ctx: dex.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.activity(step, x)
    return x


@dex.workflow
async def then(ctx: dex.WorkflowContext, activity: str, text: str) -> str:
    """One ``step``, then ``activity`` on ``text`` (chained after the first); its failure's type
    if it fails."""
    await ctx.activity(step, 0)
    try:
        return await ctx.activity(activity, text)  # type: ignore[no-any-return]
    except dex.ActivityFailedError as exc:
        return f"failed: {exc.failure.type}"


WORKFLOWS = [steps, then, awaits]
ACTIVITIES = [step, echo, poisoned, hostile, awaited]


class Claims:
    """Counts the activity tasks the store gives the engine (claims, and completions that claim
    what they created), each grant once; with ``fail``, the first ``failures`` workflow writes
    that carry an answered step raise it."""

    def __init__(self, store: Any, fail: Callable[[], BaseException] | None = None, failures: int = 0) -> None:
        self.tasks: list[ActivityTask] = []
        self.failed = 0
        self._seen: set[tuple[str, int, int]] = set()
        self._fail, self._failures = fail, failures
        self._lock = threading.Lock()
        claim, complete_then_claim = store.claim_activity_tasks, store.complete_workflow_tasks_then_claim
        complete = store.complete_workflow_tasks

        def claiming(*args: Any, **kwargs: Any) -> list[ActivityTask]:
            return self._record(claim(*args, **kwargs))

        def completing_then_claiming(results: Any, *args: Any, **kwargs: Any) -> Any:
            self._failing(results)
            applied, tasks = complete_then_claim(results, *args, **kwargs)
            self._record(tasks)
            return applied, tasks

        def completing(results: Any, *args: Any, **kwargs: Any) -> Any:
            self._failing(results)
            return complete(results, *args, **kwargs)

        store.claim_activity_tasks = claiming
        store.complete_workflow_tasks_then_claim = completing_then_claiming
        store.complete_workflow_tasks = completing

    def _failing(self, results: Any) -> None:
        if self._fail is None or not any(isinstance(task, AnsweredStep) for task, _ in results):
            return
        with self._lock:
            if self.failed >= self._failures:
                return
            self.failed += 1
        raise self._fail()

    def _record(self, tasks: list[ActivityTask]) -> list[ActivityTask]:
        with self._lock:
            for task in tasks:
                key = (task.queue, task.task_id, task.lease.version)
                if key not in self._seen:
                    self._seen.add(key)
                    self.tasks.append(task)
        return tasks


def _started(make_engine: Any, chained: float = 5.0, inline: float = 0.005, **fail: Any) -> tuple[dex.Engine, Claims]:
    attempts.clear()
    engine: dex.Engine = make_engine(
        WORKFLOWS,
        ACTIVITIES,
        poll_interval=0.01,
        inline_activity_seconds=inline,
        chained_activity_seconds=chained,
    )
    for activity in ("step", "echo", "poisoned", "hostile", "awaited"):
        engine.activity_worker.durations.record(activity, 0.02)  # too slow for the workflow thread
    claims = Claims(engine.store, **fail)
    engine.start()
    return engine, claims


def _healthy(engine: dex.Engine) -> None:
    assert engine.wait(engine.start_workflow(steps, 3), timeout=20) == 3
    assert engine.health().threads_alive, engine.health()


def _ran(name: str) -> list[int]:
    with _lock:
        return sorted(attempt for activity, attempt in attempts if activity == name)


def test_the_next_activities_run_in_the_ended_attempts_thread(make_engine: Any) -> None:
    engine, claims = _started(make_engine)
    run_ids = [engine.start_workflow(steps, 4) for _ in range(5)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [4] * 5
    assert len(attempts) == 20 and _ran("step") == [1] * 20  # each activity ran once
    # the first activity of each run is a task; an answered one goes on with the rest in its
    # thread (an attempt that ends before its run's executor is cached goes the ordinary way)
    assert len(claims.tasks) <= 12, len(claims.tasks)
    for run_id in run_ids:
        history = engine.history(run_id)
        dex.testing.replay(steps, history)  # the history the ordinary path writes
        assert sum(isinstance(e.event, ev.ActivityTaskCompleted) for e in history) == 4
    _healthy(engine)


def test_async_activities_awaited_on_the_loop_chain_too(make_engine: Any) -> None:
    engine, claims = _started(make_engine)
    run_ids = [engine.start_workflow(awaits, 3) for _ in range(4)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [3] * 4
    assert _ran("awaited") == [1] * 12  # each activity ran once
    # most runs: the first activity alone a task (with nothing chained, all twelve are)
    assert len(claims.tasks) <= 8, len(claims.tasks)
    for run_id in run_ids:
        dex.testing.replay(awaits, engine.history(run_id))
    _healthy(engine)


@pytest.mark.parametrize(("chained", "inline"), [(0.0, 0.005), (5.0, 0.0)], ids=["chained-0", "inline-0"])
def test_zero_runs_every_such_activity_as_a_task(make_engine: Any, chained: float, inline: float) -> None:
    engine, claims = _started(make_engine, chained=chained, inline=inline)
    run_ids = [engine.start_workflow(steps, 4) for _ in range(3)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [4] * 3
    assert len(claims.tasks) == 12 and _ran("step") == [1] * 12  # each attempt a task of its own
    _healthy(engine)


def test_a_step_whose_claim_was_taken_over_chains_nothing(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answered step of an activity claimed again after a lease lapsed (its claim's version
    2) runs no activity chained: one that blocks would be repeated in place after every lapse.
    (Here only the step is told its claim is a second one; the store applies it as usual.)"""
    taken = workflow_worker.answered_step

    def second_claim(*args: Any) -> Any:
        step = taken(*args)
        if step is None:
            return None
        answered, given = step
        return attrs.evolve(answered, lease=attrs.evolve(answered.lease, version=2)), given

    monkeypatch.setattr(workflow_worker, "answered_step", second_claim)
    engine, claims = _started(make_engine)
    run_id = engine.start_workflow(steps, 3)
    assert engine.wait(run_id, timeout=30) == 3
    assert _ran("step") == [1, 1, 1]
    assert len(claims.tasks) == 3  # each activity a task: nothing ran chained
    monkeypatch.setattr(workflow_worker, "answered_step", taken)
    _healthy(engine)


def _wait_advancing(engine: dex.Engine, clock: VirtualClock, run_id: str) -> Any:
    """``engine.wait(run_id)``, moving the virtual clock on while the run waits (a retry's delay)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return engine.wait(run_id, timeout=0.05)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
            clock.advance(timedelta(seconds=1))


@pytest.mark.parametrize("kind", ["unprintable", "interrupt", "exit"])
def test_a_chained_attempt_raising_the_hostile_is_retried_as_a_task(
    make_engine: Any, clock: VirtualClock, kind: str
) -> None:
    engine, claims = _started(make_engine)
    run_id = engine.start_workflow(then, "hostile", kind)
    assert _wait_advancing(engine, clock, run_id) == f"{kind} survived"
    assert _ran("hostile") == [1, 2]  # the first attempt's failure, then its retry as a task
    assert any(task.name == "hostile" and task.attempt == 2 for task in claims.tasks)
    failures = [e.event for e in engine.history(run_id) if isinstance(e.event, ev.ActivityTaskFailed)]
    assert failures == []  # a retried attempt is no step of the history
    _healthy(engine)


def test_a_chained_result_that_cannot_be_stored_fails_that_attempt(make_engine: Any) -> None:
    engine, _claims = _started(make_engine)
    run_id = engine.start_workflow(then, "poisoned", "nul \x00 and")
    assert engine.wait(run_id, timeout=30) == "failed: SerializationError"  # the run's own, caught by its code
    assert _ran("poisoned") == [1]
    _healthy(engine)


@pytest.mark.parametrize("text", ["nul \x00 inside", "lone \udc80 surrogate"])
def test_values_with_nul_and_lone_surrogates(make_engine: Any, text: str) -> None:
    engine, _claims = _started(make_engine)
    if "\udc80" in text:  # refused at the start, where the caller sees it
        with pytest.raises(dex.SerializationError):
            engine.start_workflow(then, "echo", text)
    else:
        assert engine.wait(engine.start_workflow(then, "echo", text), timeout=30) == text
    _healthy(engine)


@pytest.mark.parametrize("kind", ["connection", "unprintable", "interrupt"])
def test_the_store_failing_a_chains_write_runs_its_activities_again(make_engine: Any, kind: str) -> None:
    fail: Callable[[], BaseException] = {
        "connection": lambda: ConnectionError("the store went away"),
        "unprintable": Unprintable,
        "interrupt": lambda: KeyboardInterrupt("in the store"),
    }[kind]
    engine, claims = _started(make_engine, fail=fail, failures=2)
    run_ids = [engine.start_workflow(steps, 3) for _ in range(2)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [3] * 2
    assert claims.failed == 2
    # what the failed writes carried runs again (at least once); every step is in the history once
    assert len(_ran("step")) >= 6
    for run_id in run_ids:
        history = engine.history(run_id)
        dex.testing.replay(steps, history)
        assert sum(isinstance(e.event, ev.ActivityTaskCompleted) for e in history) == 3
    _healthy(engine)


def test_the_limit_is_checked(make_engine: Any) -> None:
    with pytest.raises(ValueError, match="chained_activity_seconds must not be negative"):
        make_engine(WORKFLOWS, ACTIVITIES, chained_activity_seconds=-1)
    with pytest.raises(ValueError, match="chained_activity_seconds must be a number of seconds, got nan"):
        make_engine(WORKFLOWS, ACTIVITIES, chained_activity_seconds=float("nan"))
    with pytest.raises(ValueError, match="inline_activity_seconds must be a number of seconds, got nan"):
        make_engine(WORKFLOWS, ACTIVITIES, inline_activity_seconds=float("nan"))
    with pytest.raises(TypeError, match="chained_activity_seconds must be a number"):
        make_engine(WORKFLOWS, ACTIVITIES, chained_activity_seconds=True)
