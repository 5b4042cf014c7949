"""Starts by an instance id used before, on every adapter (docs/reference/contract.md §15):
``id_reuse`` ("allow", "failed_only", "never") for ended runs, and debounced starts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


@dex.workflow(name="echo")
async def echo(ctx: dex.WorkflowContext, value: str) -> str:
    if value == "fail":
        raise RuntimeError("asked to fail")
    return value


@dex.workflow(name="held")
async def held(ctx: dex.WorkflowContext, value: str) -> str:
    await ctx.wait_for_event("go")
    return value


@dex.workflow(name="other")
async def other(ctx: dex.WorkflowContext, value: str) -> str:
    return "other " + value


def _ended(engine: dex.Engine, value: str, key: str = "order-1") -> str:
    run_id = engine.start_workflow(echo, value, instance_id=key)
    engine.drain()
    assert engine.get_run(run_id).status.is_terminal
    return run_id


# -- id_reuse ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["allow", "failed_only", "never"])
def test_a_first_start_makes_a_run_in_every_mode(make_engine: Any, mode: str) -> None:
    engine = make_engine([echo])
    run_id = engine.start_workflow(echo, "a", instance_id="order-1", id_reuse=mode)
    engine.drain()
    assert engine.wait(run_id) == "a"
    assert [r.run_id for r in engine.list_runs(instance_id="order-1")] == [run_id]


@pytest.mark.parametrize("mode", ["allow", "failed_only", "never"])
def test_a_live_run_answers_every_mode(make_engine: Any, mode: str) -> None:
    engine = make_engine([held])
    live = engine.start_workflow(held, "a", instance_id="order-1")
    engine.drain()
    assert engine.start_workflow(held, "b", instance_id="order-1", id_reuse=mode) == live
    assert len(engine.list_runs(instance_id="order-1")) == 1


def test_allow_makes_a_new_run_after_any_end(make_engine: Any) -> None:
    engine = make_engine([echo])
    first = _ended(engine, "a")
    second = engine.start_workflow(echo, "b", instance_id="order-1", id_reuse="allow")
    assert second != first
    engine.drain()
    assert engine.wait(second) == "b"


def test_never_returns_the_ended_run_whatever_its_end(make_engine: Any) -> None:
    engine = make_engine([echo])
    completed = _ended(engine, "a", "k-completed")
    failed = _ended(engine, "fail", "k-failed")
    assert engine.get_run(failed).status is dex.RunStatus.FAILED
    assert engine.start_workflow(echo, "b", instance_id="k-completed", id_reuse="never") == completed
    assert engine.start_workflow(echo, "b", instance_id="k-failed", id_reuse="never") == failed
    engine.drain()
    assert len(engine.list_runs(instance_id="k-completed")) == 1
    assert len(engine.list_runs(instance_id="k-failed")) == 1
    assert engine.wait(completed) == "a"  # nothing about the old run changed


def test_never_returns_the_newest_of_several_ended_runs(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([echo])
    _ended(engine, "a")
    clock.advance(timedelta(seconds=1))
    newest = _ended(engine, "b")
    assert engine.start_workflow(echo, "c", instance_id="order-1", id_reuse="never") == newest


def test_failed_only_makes_a_new_run_only_after_a_run_that_did_not_succeed(make_engine: Any) -> None:
    engine = make_engine([echo, held])
    completed = _ended(engine, "a", "k-completed")
    assert engine.start_workflow(echo, "b", instance_id="k-completed", id_reuse="failed_only") == completed

    failed = _ended(engine, "fail", "k-failed")
    retried = engine.start_workflow(echo, "b", instance_id="k-failed", id_reuse="failed_only")
    assert retried != failed
    engine.drain()
    assert engine.wait(retried) == "b"
    # the new run succeeded: now the id is taken for good under failed_only
    assert engine.start_workflow(echo, "c", instance_id="k-failed", id_reuse="failed_only") == retried

    cancelled = engine.start_workflow(held, "x", instance_id="k-cancelled")
    engine.drain()
    engine.cancel(cancelled)
    engine.drain()
    assert engine.get_run(cancelled).status is dex.RunStatus.CANCELLED
    again = engine.start_workflow(held, "y", instance_id="k-cancelled", id_reuse="failed_only")
    assert again != cancelled


def test_never_holds_only_as_long_as_retention_keeps_the_run(
    make_engine: Any, adapter_factory: Any, clock: VirtualClock
) -> None:
    engine = make_engine([echo])
    first = _ended(engine, "a")
    clock.advance(timedelta(days=8))
    assert adapter_factory().delete_finished_runs(clock.now(), 100) == 1
    second = engine.start_workflow(echo, "b", instance_id="order-1", id_reuse="never")
    assert second != first
    engine.drain()
    assert engine.wait(second) == "b"


def test_start_by_name_takes_id_reuse(make_engine: Any) -> None:
    engine = make_engine([echo])
    first = _ended(engine, "a")
    assert engine.start_by_name("echo", ["b"], instance_id="order-1", id_reuse="never") == first
    assert engine.start_by_name("echo", ["b"], instance_id="order-1", id_reuse="allow") != first


def test_two_engines_on_one_store_make_one_run_under_never(make_engine: Any) -> None:
    a, b = make_engine([echo]), make_engine([echo])
    first = a.start_workflow(echo, "a", instance_id="order-1", id_reuse="never")
    a.drain()
    assert b.start_workflow(echo, "b", instance_id="order-1", id_reuse="never") == first
    assert len(b.list_runs(instance_id="order-1")) == 1


# -- debounce ---------------------------------------------------------------------------------
def test_debounced_starts_replace_the_arguments_and_push_the_start(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([echo])
    t0 = clock.now()
    run_id = engine.start_workflow(echo, "a", instance_id="search", debounce=timedelta(seconds=10))
    clock.advance(timedelta(seconds=4))
    assert engine.start_workflow(echo, "b", instance_id="search", debounce=timedelta(seconds=10)) == run_id
    engine.drain(advance_time=False)  # due at t0 + 14 s: nothing runs yet
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED
    engine.drain()
    assert engine.wait(run_id) == "b"
    info = engine.get_run(run_id)
    assert info.started_at == t0 + timedelta(seconds=14)
    assert info.created_at == t0
    assert len(engine.list_runs(instance_id="search")) == 1


def test_debounce_max_caps_how_far_the_start_moves(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([echo])
    t0 = clock.now()
    wait, cap = timedelta(seconds=10), timedelta(seconds=25)
    run_id = engine.start_workflow(echo, "0", instance_id="typing", debounce=wait, debounce_max=cap)
    for n in range(1, 4):  # a start every 8 s would push the start for ever without the cap
        clock.advance(timedelta(seconds=8))
        assert engine.start_workflow(echo, str(n), instance_id="typing", debounce=wait, debounce_max=cap) == run_id
        engine.drain(advance_time=False)
        assert engine.get_run(run_id).status is dex.RunStatus.CREATED
    engine.drain()  # the clock jumps to the cap, not to the last start + 10 s
    assert engine.get_run(run_id).started_at == t0 + cap
    assert engine.wait(run_id) == "3"  # the last start made before the run began


def test_a_debounced_start_after_the_run_began_changes_nothing(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([held])
    run_id = engine.start_workflow(held, "a", instance_id="k", debounce=timedelta(seconds=5))
    clock.advance(timedelta(seconds=6))
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
    assert engine.start_workflow(held, "b", instance_id="k", debounce=timedelta(seconds=5)) == run_id
    engine.send_event(run_id, "go")
    engine.drain()
    assert engine.wait(run_id) == "a"


def test_a_debounced_start_of_another_workflow_leaves_the_waiting_run_alone(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([echo, other])
    run_id = engine.start_workflow(echo, "a", instance_id="k", debounce=timedelta(seconds=5))
    assert engine.start_workflow(other, "b", instance_id="k", debounce=timedelta(seconds=5)) == run_id
    engine.drain()
    assert engine.wait(run_id) == "a"


def test_debounce_follows_id_reuse_once_the_run_ended(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([echo])
    first = engine.start_workflow(echo, "a", instance_id="k", debounce=timedelta(seconds=5))
    engine.drain()
    assert engine.wait(first) == "a"
    assert engine.start_workflow(echo, "b", instance_id="k", debounce=timedelta(seconds=5), id_reuse="never") == first
    later = engine.start_workflow(echo, "c", instance_id="k", debounce=timedelta(seconds=5))
    assert later != first
    engine.drain()
    assert engine.wait(later) == "c"


def test_a_debounced_run_can_be_cancelled_before_it_starts(make_engine: Any, clock: VirtualClock) -> None:
    engine = make_engine([echo])
    run_id = engine.start_workflow(echo, "a", instance_id="k", debounce=timedelta(minutes=5))
    engine.cancel(run_id)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED
    assert engine.get_run(run_id).started_at is None


def test_zero_debounce_starts_at_once(make_engine: Any) -> None:
    engine = make_engine([echo])
    run_id = engine.start_workflow(echo, "a", instance_id="k", debounce=timedelta(0))
    engine.drain(advance_time=False)
    assert engine.wait(run_id) == "a"


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"id_reuse": "sometimes"}, ValueError, "id_reuse must be one of"),
        ({"id_reuse": None}, TypeError, "id_reuse must be one of"),
        ({"id_reuse": 1}, TypeError, "got int"),
        ({"id_reuse": "never\x00"}, ValueError, "id_reuse must be one of"),
        ({"id_reuse": "never\ud800"}, ValueError, "id_reuse must be one of"),
        ({"debounce": 5}, TypeError, "debounce must be a datetime.timedelta"),
        ({"debounce": timedelta(seconds=-1)}, ValueError, "debounce must not be negative"),
        ({"debounce": timedelta(1), "debounce_max": timedelta(-1)}, ValueError, "debounce_max must not be negative"),
        ({"debounce_max": timedelta(seconds=5)}, ValueError, "debounce_max needs debounce"),
    ],
)
def test_bad_rules_are_refused_before_anything_is_written(
    make_engine: Any, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    engine = make_engine([echo])
    with pytest.raises(error, match=words):
        engine.start_workflow(echo, "a", instance_id="k", **kwargs)
    assert engine.list_runs() == []
    healthy = engine.start_workflow(echo, "ok", instance_id="k", id_reuse="never")
    engine.drain()
    assert engine.wait(healthy) == "ok"


@pytest.mark.parametrize(
    "kwargs", [{"id_reuse": "never"}, {"id_reuse": "failed_only"}, {"debounce": timedelta(seconds=1)}]
)
def test_a_rule_without_an_instance_id_is_refused(make_engine: Any, kwargs: dict[str, Any]) -> None:
    engine = make_engine([echo])
    with pytest.raises(ValueError, match="needs an instance_id"):
        engine.start_workflow(echo, "a", **kwargs)
    assert engine.list_runs() == []


@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b", ""])
@pytest.mark.parametrize("mode", ["failed_only", "never"])
def test_poisoned_instance_ids_are_refused_under_every_rule(make_engine: Any, bad: str, mode: str) -> None:
    engine = make_engine([echo])
    with pytest.raises(ValueError, match="instance_id"):
        engine.start_workflow(echo, "a", instance_id=bad, id_reuse=mode)
    with pytest.raises(ValueError, match="instance_id"):
        engine.start_workflow(echo, "a", instance_id=bad, debounce=timedelta(seconds=1))
    assert engine.list_runs() == []
    healthy = engine.start_workflow(echo, "ok", instance_id="fine", id_reuse=mode)
    engine.drain()
    assert engine.wait(healthy) == "ok"


def test_an_id_reuse_whose_methods_raise_is_refused_by_its_value(make_engine: Any) -> None:
    class Hostile(str):
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing me")

        def __hash__(self) -> int:
            raise RuntimeError("no hashing me")

        def __str__(self) -> str:
            raise RuntimeError("no printing me")

        def __repr__(self) -> str:
            raise RuntimeError("no printing me")

    engine = make_engine([echo])
    first = _ended(engine, "a")
    # its characters say "never": that is what it means, whatever its methods do
    assert engine.start_workflow(echo, "b", instance_id="order-1", id_reuse=Hostile("never")) == first
    with pytest.raises(ValueError, match="id_reuse must be one of"):
        engine.start_workflow(echo, "b", instance_id="order-1", id_reuse=Hostile("nope"))


def test_a_debounce_whose_operators_raise_is_read_by_its_value(make_engine: Any, clock: VirtualClock) -> None:
    class Hostile(timedelta):
        def __lt__(self, other: object) -> bool:
            raise RuntimeError("no comparing me")

        def __radd__(self, other: object) -> Any:
            raise RuntimeError("no adding me")

        def __repr__(self) -> str:
            raise RuntimeError("no printing me")

    engine = make_engine([echo])
    t0 = clock.now()
    run_id = engine.start_workflow(echo, "a", instance_id="k", debounce=Hostile(seconds=3))
    engine.drain()
    assert engine.wait(run_id) == "a"
    assert engine.get_run(run_id).started_at == t0 + timedelta(seconds=3)
    with pytest.raises(ValueError, match="debounce must not be negative"):
        engine.start_workflow(echo, "b", instance_id="k2", debounce=Hostile(seconds=-3))


def test_a_poisoned_argument_of_a_debounced_start_leaves_the_waiting_run_as_it_was(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([echo])
    run_id = engine.start_workflow(echo, "a", instance_id="k", debounce=timedelta(seconds=5))
    with pytest.raises((ValueError, TypeError)):
        engine.start_workflow(echo, object(), instance_id="k", debounce=timedelta(seconds=5))
    engine.drain()
    assert engine.wait(run_id) == "a"


# -- children ---------------------------------------------------------------------------------
@dex.workflow(name="parent")
async def parent(ctx: dex.WorkflowContext, key: str, value: str, mode: str) -> str:
    try:
        return "got " + await ctx.child(echo, value, instance_id=key, id_reuse=mode)
    except dex.ChildWorkflowFailedError as exc:  # a child's failure (or a clash), as for any child
        return f"failed: {exc}"


def _parent_result(engine: dex.Engine, *args: str) -> Any:
    run_id = engine.start_workflow(parent, *args)
    engine.drain()
    return engine.wait(run_id)


def test_a_child_under_never_takes_the_ended_runs_outcome(make_engine: Any) -> None:
    engine = make_engine([parent, echo])
    first = _ended(engine, "a", "child-key")
    assert _parent_result(engine, "child-key", "b", "never") == "got a"
    assert [r.run_id for r in engine.list_runs(instance_id="child-key")] == [first]
    failed = _ended(engine, "fail", "failed-key")
    assert _parent_result(engine, "failed-key", "b", "never").startswith("failed: ")
    assert [r.run_id for r in engine.list_runs(instance_id="failed-key")] == [failed]


def test_a_child_under_failed_only_runs_again_after_a_failure_only(make_engine: Any) -> None:
    engine = make_engine([parent, echo])
    _ended(engine, "a", "done-key")
    assert _parent_result(engine, "done-key", "b", "failed_only") == "got a"
    assert len(engine.list_runs(instance_id="done-key")) == 1
    _ended(engine, "fail", "retry-key")
    assert _parent_result(engine, "retry-key", "b", "failed_only") == "got b"
    assert len(engine.list_runs(instance_id="retry-key")) == 2


def test_a_child_under_allow_or_without_an_earlier_run_is_made(make_engine: Any) -> None:
    engine = make_engine([parent, echo])
    assert _parent_result(engine, "fresh", "x", "never") == "got x"
    _ended(engine, "a", "allowed")
    assert _parent_result(engine, "allowed", "b", "allow") == "got b"
    assert len(engine.list_runs(instance_id="allowed")) == 2


def test_a_child_whose_id_a_live_run_holds_still_clashes(make_engine: Any) -> None:
    engine = make_engine([parent, echo, held])
    engine.start_workflow(held, "x", instance_id="busy")
    engine.drain()
    result = _parent_result(engine, "busy", "b", "never")
    assert result.startswith("failed: ") and "in use by a running run" in result


def test_a_bad_id_reuse_in_workflow_code_fails_at_the_call(make_engine: Any) -> None:
    engine = make_engine([parent, echo])
    run_id = engine.start_workflow(parent, "k", "b", "sometimes")
    engine.drain()
    with pytest.raises(dex.WorkflowFailedError, match="id_reuse must be one of"):
        engine.wait(run_id)
    assert engine.list_runs(instance_id="k") == []
    assert _parent_result(engine, "k", "ok", "never") == "got ok"  # a healthy one after


def test_the_asyncio_facade_takes_the_rules(make_engine: Any) -> None:
    import asyncio

    engine = make_engine([echo])
    first = _ended(engine, "a")
    again = asyncio.run(engine.start_workflow_async(echo, "b", instance_id="order-1", id_reuse="never"))
    assert again == first


# -- schedules --------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "runs"), [("never", 1), ("allow", 2)])
def test_a_schedules_runs_follow_its_id_reuse(make_engine: Any, mode: str, runs: int) -> None:
    nightly = dex.Schedule("nightly", echo, cron="0 3 * * *", args=("night",), id_reuse=mode)
    engine = make_engine([echo], schedules=[nightly])
    assert engine.get_schedule("nightly").id_reuse == mode
    first = engine.trigger_schedule("nightly")
    engine.drain(advance_time=False)
    assert engine.wait(first) == "night"
    # a second trigger in the same second names the same fire: under never, the ended run answers
    second = engine.trigger_schedule("nightly")
    assert (second == first) is (mode == "never")
    assert len(engine.list_runs(instance_id=engine.get_run(first).instance_id)) == runs
    assert engine.get_schedule("nightly").last_run_id == second


@pytest.mark.parametrize("bad", ["sometimes", 3, None, "never\x00"])
def test_a_schedule_with_a_bad_id_reuse_is_refused_when_made(bad: Any) -> None:
    with pytest.raises(ValueError, match="id_reuse must be one of"):
        dex.Schedule("nightly", echo, cron="0 3 * * *", id_reuse=bad)


def test_a_waiting_run_sent_an_event_keeps_its_arguments_and_its_start(make_engine: Any, clock: VirtualClock) -> None:
    """A message to the waiting run ends its waiting: a task may be made for it, and a worker
    would hold the arguments it read, so later debounced starts change nothing."""
    engine = make_engine([held])
    t0 = clock.now()
    run_id = engine.start_workflow(held, "a", instance_id="k", debounce=timedelta(seconds=10))
    engine.send_event(run_id, "go")
    clock.advance(timedelta(seconds=5))
    assert engine.start_workflow(held, "b", instance_id="k", debounce=timedelta(seconds=10)) == run_id
    engine.drain()
    assert engine.wait(run_id) == "a"
    assert engine.get_run(run_id).started_at == t0 + timedelta(seconds=10)


def test_a_keyed_start_keeps_its_deadline(make_engine: Any, clock: VirtualClock) -> None:
    """A start under id_reuse with a timeout gets its deadline as any start does: the run is
    cancelled with reason "timeout" when it passes."""
    engine = make_engine([held])
    run_id = engine.start_workflow(held, "a", instance_id="deadline-key", id_reuse="never", timeout=60)
    assert engine.get_run(run_id).deadline is not None
    engine.drain(advance_time=False)
    clock.advance(timedelta(seconds=61))
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED
    healthy = engine.start_workflow(held, "b", instance_id="deadline-key-2", id_reuse="never")
    engine.send_event(healthy, "go")
    engine.drain(advance_time=False)
    assert engine.get_run(healthy).status is dex.RunStatus.COMPLETED
