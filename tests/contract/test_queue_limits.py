"""A queue's key concurrency and rate limit through the engine, on every adapter
(docs/reference/contract.md §15, the queues bullet): a drained workflow whose activities are
rate-limited starts them no faster than the limit, and every bad value is refused at the call
with a clear error, before any write, leaving the queue as it was and the engine healthy.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

import dex
from dex.domain.queue_limits import MAX_KEY_CONCURRENCY, MAX_RATE_COUNT, RateLimit
from dex.testing import VirtualClock
from tests.faults import FaultyStore

STARTS: list[datetime] = []
CLOCK: list[VirtualClock] = []


@dex.activity(name="limited-call", queue="rate-limited")
def limited_call(n: int) -> int:
    STARTS.append(CLOCK[0].now())
    return n


@dex.workflow(name="fan-out")
async def fan_out(ctx: dex.WorkflowContext, n: int) -> int:
    results = await ctx.gather(*(ctx.activity(limited_call, i) for i in range(n)))
    return sum(results)


@dex.workflow(name="limits-probe")
async def probe(ctx: dex.WorkflowContext, n: int) -> int:
    return n + 1


def a_run_completes(engine: dex.Engine) -> None:
    run_id = engine.start_workflow(probe, 41)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 42


def settings_of(engine: dex.Engine, name: str, kind: str) -> tuple[int, int, Any]:
    info = next(q for q in engine.list_queues() if (q.name, q.kind) == (name, kind))
    return info.capacity, info.key_concurrency, info.rate_limit


def test_a_drained_workflow_starts_its_activities_at_the_limits_pace(make_engine: Any, clock: VirtualClock) -> None:
    STARTS.clear()
    CLOCK[:] = [clock]
    engine = make_engine([fan_out], [limited_call])
    period = timedelta(minutes=1)
    engine.create_queue("rate-limited", "activity", rate_limit=(2, period))
    begin = clock.now()
    run_id = engine.start_workflow(fan_out, 5)
    engine.drain()
    assert engine.wait(run_id, timeout=5) == 10
    # two at once, two a period later, the last a period after those: never more than 2 a minute
    assert [s - begin for s in STARTS] == [timedelta(0)] * 2 + [period] * 2 + [2 * period]


@dex.workflow(name="paced", queue="paced")
async def paced(ctx: dex.WorkflowContext, n: int) -> int:
    return n


def test_a_rate_limited_workflow_queue_starts_its_runs_at_the_limits_pace(
    make_engine: Any, clock: VirtualClock
) -> None:
    engine = make_engine([paced])
    period = timedelta(minutes=1)
    engine.create_queue("paced", "workflow", rate_limit=(1, period))
    begin = clock.now()
    run_ids = [engine.start_workflow(paced, n) for n in range(3)]
    engine.drain()
    assert [engine.wait(run_id, timeout=5) for run_id in run_ids] == [0, 1, 2]
    # each run is one workflow task: one start a minute, oldest first
    assert [engine.get_run(run_id).started_at - begin for run_id in run_ids] == [timedelta(0), period, 2 * period]


def test_list_queues_shows_the_limits(make_engine: Any) -> None:
    engine = make_engine([probe])
    engine.create_queue("tenants", "workflow", 10, key_concurrency=4, rate_limit=(100, timedelta(seconds=1)))
    assert settings_of(engine, "tenants", "workflow") == (10, 4, RateLimit(100, timedelta(seconds=1)))
    engine.set_queue_rate_limit("tenants", "workflow", None)
    engine.set_queue_key_concurrency("tenants", "workflow", 1)
    assert settings_of(engine, "tenants", "workflow") == (10, 1, None)
    a_run_completes(engine)


class Hostile:
    """A value whose repr, str and comparisons raise."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    __hash__ = None  # type: ignore[assignment]


BAD_KEY_CONCURRENCY = [0, -1, MAX_KEY_CONCURRENCY + 1, 2**63, True, 1.5, "2", None, Hostile()]


@pytest.mark.parametrize(
    "bad", BAD_KEY_CONCURRENCY, ids=[f"{n}-{type(v).__name__}" for n, v in enumerate(BAD_KEY_CONCURRENCY)]
)
def test_a_bad_key_concurrency_is_refused_before_any_write(make_engine: Any, bad: Any) -> None:
    engine = make_engine([probe])
    engine.create_queue("sized", "workflow", 5, key_concurrency=3)
    for call in (
        lambda: engine.create_queue("sized", "workflow", 5, key_concurrency=bad),
        lambda: engine.create_queue("never-made", "workflow", key_concurrency=bad),
        lambda: engine.set_queue_key_concurrency("sized", "workflow", bad),
        lambda: engine.store.create_queue("never-made", "workflow", 5, bad),
        lambda: engine.store.set_queue_key_concurrency("sized", "workflow", bad),
    ):
        with pytest.raises(ValueError, match=f"key_concurrency must be an int from 1 to {MAX_KEY_CONCURRENCY}"):
            call()
    assert settings_of(engine, "sized", "workflow") == (5, 3, None)
    assert "never-made" not in {q.name for q in engine.list_queues()}
    a_run_completes(engine)


SECOND = timedelta(seconds=1)
BAD_RATE_LIMITS = {
    "zero count": ((0, SECOND), "count must be an int from 1"),
    "negative count": ((-3, SECOND), "count must be an int from 1"),
    "count too large": ((MAX_RATE_COUNT + 1, SECOND), f"count must be an int from 1 to {MAX_RATE_COUNT}"),
    "bool count": ((True, SECOND), "count must be an int"),
    "float count": ((1.5, SECOND), "count must be an int"),
    "hostile count": ((Hostile(), SECOND), "count must be an int .* got a Hostile"),
    "zero period": ((1, timedelta(0)), "period must be a timedelta from 0:00:00.001000"),
    "negative period": ((1, -SECOND), "period must be a timedelta"),
    "sub-millisecond period": ((1, timedelta(microseconds=999)), "period must be a timedelta"),
    "period too long": ((1, timedelta(days=367)), "period must be a timedelta from .* to 366 days"),
    "seconds as a number": ((1, 5), "period must be a timedelta"),
    "a list": ([1, SECOND], "rate_limit must be None or a pair"),
    "three items": ((1, SECOND, 3), "rate_limit must be None or a pair"),
    "a string": ("3/s", "rate_limit must be None or a pair"),
    "hostile": (Hostile(), "rate_limit must be None or a pair .* got a Hostile"),
}


@pytest.mark.parametrize("bad, message", list(BAD_RATE_LIMITS.values()), ids=list(BAD_RATE_LIMITS))
def test_a_bad_rate_limit_is_refused_before_any_write(make_engine: Any, bad: Any, message: str) -> None:
    engine = make_engine([probe])
    engine.create_queue("limited", "activity", 5, rate_limit=(7, SECOND))
    for call in (
        lambda: engine.create_queue("limited", "activity", 5, rate_limit=bad),
        lambda: engine.create_queue("never-made", "workflow", rate_limit=bad),
        lambda: engine.set_queue_rate_limit("limited", "activity", bad),
        lambda: engine.store.create_queue("never-made", "activity", 5, 1, bad),
        lambda: engine.store.set_queue_rate_limit("limited", "activity", bad),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    assert settings_of(engine, "limited", "activity") == (5, 1, (7, SECOND))
    assert "never-made" not in {q.name for q in engine.list_queues()}
    a_run_completes(engine)


POISONS = {"nul": "tenants\x00A", "surrogate": "tenants\ud800A", "empty": ""}


@pytest.mark.parametrize("name", list(POISONS.values()), ids=list(POISONS))
def test_a_poisoned_queue_name_is_refused_at_each_call(make_engine: Any, name: str) -> None:
    engine = make_engine([probe])
    for call in (
        lambda: engine.create_queue(name, "workflow", key_concurrency=2, rate_limit=(1, SECOND)),
        lambda: engine.set_queue_key_concurrency(name, "workflow", 2),
        lambda: engine.set_queue_rate_limit(name, "activity", (1, SECOND)),
        lambda: engine.set_queue_rate_limit(name, "activity", None),
        lambda: engine.store.set_queue_key_concurrency(name, "workflow", 2),
        lambda: engine.store.set_queue_rate_limit(name, "workflow", RateLimit(1, SECOND)),
    ):
        with pytest.raises(ValueError, match="queue"):
            call()
    assert all(q.name in ("default",) for q in engine.list_queues())
    a_run_completes(engine)


def test_a_bad_kind_is_refused(make_engine: Any) -> None:
    engine = make_engine([probe])
    with pytest.raises(ValueError, match="queue kind must be 'workflow' or 'activity'"):
        engine.set_queue_rate_limit("default", "timer", (1, SECOND))
    with pytest.raises(ValueError, match="queue kind must be 'workflow' or 'activity'"):
        engine.set_queue_key_concurrency("default", "workflow\x00", 2)
    a_run_completes(engine)


@pytest.mark.parametrize("fault", ["before", "after"])
def test_a_store_that_fails_during_a_set_fails_that_call_only(
    adapter_factory: Any, clock: VirtualClock, fault: str
) -> None:
    """The call raises the store's fault; before the store, nothing changed; after it, the
    change is whole. Either way the engine runs the next workflow."""
    faulty = FaultyStore(adapter_factory(), rate=1.0, weights={fault: 1.0})
    engine = dex.Engine(faulty, workflows=[probe])  # type: ignore[arg-type]
    try:
        engine.create_queue("api", "activity", 5)
        faulty.enabled = True
        with pytest.raises(ConnectionError):
            engine.set_queue_rate_limit("api", "activity", (3, SECOND))
        with pytest.raises(ConnectionError):
            engine.set_queue_key_concurrency("api", "activity", 4)
        faulty.enabled = False
        expected = (5, 1, None) if fault == "before" else (5, 4, (3, SECOND))
        assert settings_of(engine, "api", "activity") == expected
        a_run_completes(engine)
    finally:
        engine.stop(timeout=5)
