"""One write per activity (:mod:`dex.app.workflows.answers`) on a started engine, on every adapter.

An attempt whose run's executor this engine holds is written together with the step it
answers. These tests check that it happens, that the history is the one the ordinary path
writes (it replays), and that every way it can go wrong leaves the run to the ordinary path
and nothing else: the store failing the write (a lost connection, an exception that cannot be
printed, a ``BaseException``, a refusal), a run suspended while its activity ran, workflow
code that raises what cannot be printed, values with NUL and lone surrogates. Each ends with
a healthy run that completes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import dex
from dex.app.ports.store import AnsweredStep, StoreRejectedError
from dex.app.runtime import coordination as co
from dex.app.runtime.options import RuntimeOptions
from dex.domain import events as ev

attempts: list[int] = []
gate = threading.Event()
at_gate = threading.Event()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@dex.activity
def inc(x: int) -> int:
    attempts.append(x)
    return x + 1


@dex.activity
def echo(text: str) -> str:
    return text


@dex.activity
def poisoned(text: str) -> str:
    return text + " \udc80"  # a result that cannot be stored: the attempt's own failure


@dex.activity
def wait_at_gate() -> str:
    at_gate.set()
    gate.wait(10)
    return "through"


@dex.workflow
async def steps(ctx: dex.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.activity(inc, x)
    return x


@dex.workflow
async def calls(ctx: dex.WorkflowContext, activity: str, text: str) -> str:
    """Runs activity ``activity`` (``echo`` or ``poisoned``) on ``text``; its failure's type if it fails."""
    try:
        return await ctx.activity(activity, text)  # type: ignore[no-any-return]
    except dex.ActivityFailedError as exc:
        return f"failed: {exc.failure.type}"


@dex.workflow
async def gated(ctx: dex.WorkflowContext) -> str:
    passed = await ctx.activity(wait_at_gate)
    return f"{passed} {await ctx.activity(inc, 1)}"


@dex.workflow
async def raises_after(ctx: dex.WorkflowContext, kind: str) -> None:
    await ctx.activity(inc, 1)
    if kind == "unprintable":
        raise Unprintable()
    raise KeyboardInterrupt("raised by the workflow after its activity")


blocked: list[float] = []


@dex.workflow
async def blocks_once(ctx: dex.WorkflowContext) -> int:
    x = await ctx.activity(inc, 1)
    if not blocked:  # the first time its code runs past this point, it spins for 3 s
        blocked.append(time.monotonic())
        while time.monotonic() < blocked[0] + 3:
            pass
    return await ctx.activity(inc, x)  # type: ignore[no-any-return]


WORKFLOWS = [steps, calls, gated, raises_after, blocks_once]
ACTIVITIES = [inc, echo, poisoned, wait_at_gate]


class Answers:
    """Counts the answered steps the store applied and declined, and the ordinary outcome
    writes; with ``fail``, the first ``failures`` writes that carry an answered step raise."""

    def __init__(self, store: Any, fail: Callable[[], BaseException] | None = None, failures: int = 0) -> None:
        self.applied = self.declined = self.ordinary = self.failed = self.tasks = 0
        self._fail, self._failures = fail, failures
        self._inside = threading.local()
        for name in ("complete_workflow_tasks", "complete_workflow_tasks_then_claim"):
            setattr(store, name, self._counting(getattr(store, name)))
        for name in ("complete_activity_tasks", "complete_activity_tasks_then_claim"):
            setattr(store, name, self._outcomes(getattr(store, name)))

    def _counting(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def write(results: Any, *args: Any) -> Any:
            if getattr(self._inside, "writing", False):  # an adapter's method calling another
                return real(results, *args)
            answers = [isinstance(task, AnsweredStep) for task, _result in results]
            if any(answers) and self._fail is not None and self.failed < self._failures:
                self.failed += 1
                raise self._fail()
            self._inside.writing = True
            try:
                got = real(results, *args)
            finally:
                self._inside.writing = False
            applied = got[0] if isinstance(got, tuple) else got
            for answer, ok in zip(answers, applied, strict=True):
                if answer:
                    self.applied += ok
                    self.declined += not ok
                else:
                    self.tasks += ok  # a workflow task of a queue, written
            return got

        return write

    def _outcomes(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def write(outcomes: Any, *args: Any) -> Any:
            if getattr(self._inside, "writing", False):
                return real(outcomes, *args)
            self.ordinary += sum(1 for o in outcomes if o.retry_at is None)
            self._inside.writing = True
            try:
                return real(outcomes, *args)
            finally:
                self._inside.writing = False

        return write


def _started(
    make_engine: Any, runtime_options: RuntimeOptions | None = None, **fail: Any
) -> tuple[dex.Engine, Answers]:
    attempts.clear()
    engine: dex.Engine = make_engine(
        WORKFLOWS, ACTIVITIES, poll_interval=0.01, inline_activity_seconds=0, runtime_options=runtime_options
    )
    answers = Answers(engine.store, **fail)
    engine.start()
    return engine, answers


def _healthy(engine: dex.Engine) -> None:
    assert engine.wait(engine.start_workflow(steps, 3), timeout=20) == 3
    assert engine.health().threads_alive, engine.health()


def test_each_activity_is_written_with_the_step_it_answers(make_engine: Any) -> None:
    engine, answers = _started(make_engine)
    run_ids = [engine.start_workflow(steps, 4) for _ in range(5)]
    assert [engine.wait(run_id, timeout=20) for run_id in run_ids] == [4] * 5
    assert sorted(attempts) == sorted([0, 1, 2, 3] * 5)  # every activity ran once
    # an attempt of this engine finds its run's executor cached (the step that scheduled it
    # was written before the attempt began): most outcomes go with their steps
    # (wait() may see the last commit before the writing thread is back to count it)
    settled = time.monotonic() + 5
    while answers.applied + answers.ordinary < 20 and time.monotonic() < settled:
        time.sleep(0.01)
    assert answers.applied >= 10, vars(answers)
    assert answers.applied + answers.ordinary == 20, vars(answers)
    for run_id in run_ids:
        history = engine.history(run_id)
        dex.testing.replay(steps, history)
        assert sum(isinstance(e.event, ev.ActivityTaskCompleted) for e in history) == 4


def test_an_answered_step_frees_no_room_in_a_workflow_queue(make_engine: Any) -> None:
    """Only a workflow task of a queue, written, is room for the next one there: under load it
    ends the scheduler's batch window early. An answered step took no slot, so its write ends no
    window (it did for each one, and the scheduler's rounds came per flush instead of per window)."""
    room: list[object] = []
    engine, answers = _started(
        make_engine,
        RuntimeOptions(
            observe=lambda event, _commands: room.append(event) if isinstance(event, co.TaskWritten) else None
        ),
    )
    run_ids = [engine.start_workflow(steps, 4) for _ in range(5)]
    assert [engine.wait(run_id, timeout=20) for run_id in run_ids] == [4] * 5
    settled = time.monotonic() + 5
    while (answers.applied + answers.ordinary < 20 or len(room) < answers.tasks) and time.monotonic() < settled:
        time.sleep(0.01)
    assert answers.applied >= 10, vars(answers)
    assert len(room) == answers.tasks, (len(room), vars(answers))
    _healthy(engine)


@pytest.mark.parametrize("kind", ["connection", "unprintable", "interrupt", "refused"])
def test_a_store_failing_answered_writes_leaves_them_to_the_ordinary_path(make_engine: Any, kind: str) -> None:
    fail: Callable[[], BaseException] = {
        "connection": lambda: ConnectionError("the store went away"),
        "unprintable": Unprintable,
        "interrupt": lambda: KeyboardInterrupt("in the store"),
        "refused": lambda: StoreRejectedError("the store refuses this"),
    }[kind]
    engine, answers = _started(make_engine, fail=fail, failures=3)
    run_ids = [engine.start_workflow(steps, 3) for _ in range(3)]
    assert [engine.wait(run_id, timeout=30) for run_id in run_ids] == [3] * 3
    assert answers.failed == 3
    assert sorted(attempts) == sorted([0, 1, 2] * 3)  # nothing ran twice for it
    for run_id in run_ids:
        dex.testing.replay(steps, engine.history(run_id))
    _healthy(engine)


def test_a_run_suspended_while_its_activity_ran_takes_the_outcome_when_resumed(make_engine: Any) -> None:
    gate.clear()
    at_gate.clear()
    engine, answers = _started(make_engine)
    run_id = engine.start_workflow(gated)
    assert at_gate.wait(10)
    engine.suspend(run_id)
    gate.set()
    # the outcome is not written with a step (the run is suspended): it waits in the inbox
    settled = time.monotonic() + 5
    while answers.ordinary < 1 and time.monotonic() < settled:
        time.sleep(0.01)
    assert answers.ordinary >= 1, vars(answers)
    assert engine.get_run(run_id).status is dex.RunStatus.SUSPENDED
    engine.resume(run_id)
    assert engine.wait(run_id, timeout=20) == "through 2"
    history = engine.history(run_id)
    kinds = [type(e.event).__name__ for e in history]
    assert kinds.index("RunSuspended") < kinds.index("ActivityTaskCompleted")  # in the order they came
    _healthy(engine)


@pytest.mark.parametrize("kind", ["unprintable", "interrupt"])
def test_workflow_code_raising_in_an_answered_step_fails_its_own_run(make_engine: Any, kind: str) -> None:
    engine, answers = _started(make_engine)
    run_id = engine.start_workflow(raises_after, kind)
    with pytest.raises(dex.WorkflowFailedError):
        engine.wait(run_id, timeout=20)
    settled = time.monotonic() + 5  # (wait() may see the commit before the writer counts it)
    while answers.applied < 1 and time.monotonic() < settled:
        time.sleep(0.01)
    assert answers.applied == 1, vars(answers)  # the failure was recorded with the activity's outcome
    _healthy(engine)


@pytest.mark.parametrize("text", ["nul \x00 inside", "lone \udc80 surrogate"])
def test_values_with_nul_and_lone_surrogates(make_engine: Any, text: str) -> None:
    engine, _answers = _started(make_engine)
    if "\udc80" in text:  # refused at the start, where the caller sees it
        with pytest.raises(dex.SerializationError):
            engine.start_workflow(calls, "echo", text)
    else:
        assert engine.wait(engine.start_workflow(calls, "echo", text), timeout=20) == text
    _healthy(engine)


def test_an_activity_result_with_a_lone_surrogate_fails_that_attempt_in_its_answered_step(make_engine: Any) -> None:
    engine, answers = _started(make_engine)
    run_id = engine.start_workflow(calls, "poisoned", "nul \x00 and")
    assert engine.wait(run_id, timeout=20) == "failed: SerializationError"  # the run's own, caught by its code
    settled = time.monotonic() + 5  # (wait() may see the commit before the writer counts it)
    while answers.applied < 1 and time.monotonic() < settled:
        time.sleep(0.01)
    assert answers.applied == 1, vars(answers)  # the failure went with the step it answered
    _healthy(engine)


def test_workflow_code_blocking_an_answered_step_is_given_back_and_its_run_goes_on(make_engine: Any) -> None:
    blocked.clear()
    attempts.clear()
    engine: dex.Engine = make_engine(
        WORKFLOWS, ACTIVITIES, poll_interval=0.01, inline_activity_seconds=0, workflow_task_deadline=1.0
    )
    answers = Answers(engine.store)
    engine.start()
    run_id = engine.start_workflow(blocks_once)
    assert engine.wait(run_id, timeout=30) == 3  # the watchdog gave the step back; the retry goes on
    assert blocked and attempts == [1, 2]  # the activity's outcome was written once, not redone
    assert answers.ordinary >= 1, vars(answers)  # the blocked step's outcome went the ordinary way
    _healthy(engine)
