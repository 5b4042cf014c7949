"""Schedules under hypothesis (docs/reference/contract.md §10), on the in-memory adapter with the virtual clock.

Generated cron expressions, time zones, up-and-down time lines and crashes (an engine
replaced by a new one; a fire whose acknowledgement is lost after it committed): the runs
started are exactly the fire times the cron module computes, minus the fires the catch-up
rule explains (missed while down, not younger than the window when an engine came back),
each at most once. Also: a store failing mid-step delays only the fire it failed, and a
healthy run started meanwhile completes.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.schedules import ScheduleAdvance
from dex.app.schedules.times import next_cron_fire, zone
from dex.testing import VirtualClock

T0 = datetime(2026, 3, 28, 20, tzinfo=UTC)  # five hours before Europe's spring change


@dex.workflow
async def tick(ctx: dex.WorkflowContext) -> None:
    return None


class LossyStore:
    """The in-memory store, but ``advance_schedule`` sometimes fails: before it reaches the
    store, or after it committed (the answer lost)."""

    def __init__(self, store: InMemoryAdapter, rng: random.Random, rate: float) -> None:
        self._store, self._rng, self._rate = store, rng, rate
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        draw = self._rng.random()
        if draw < self._rate / 2:
            raise ConnectionError("injected: the database is unreachable")
        result = self._store.advance_schedule(advance, now)
        if draw < self._rate:
            self.lost += 1
            raise ConnectionError("injected: the commit's answer was lost")
        return result


MINUTES = st.sampled_from(["*/5", "0", "15,45", "*/20", "7", "0-10/5"])
HOURS = st.sampled_from(["*", "*/2", "1-3", "2", "9-17"])
ZONES = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    minute=MINUTES,
    hour=HOURS,
    tz_name=ZONES,
    segments=st.lists(st.tuples(st.integers(10, 240), st.integers(0, 300)), min_size=1, max_size=4),
    window=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    fault_rate=st.sampled_from([0.0, 0.2]),
)
def test_runs_started_are_the_computed_fires_minus_explained_skips(
    minute: str, hour: str, tz_name: str, segments: list[tuple[int, int]], window: int, seed: int, fault_rate: float
) -> None:
    clock = VirtualClock(T0)
    memory = InMemoryAdapter(clock=clock)
    store = LossyStore(memory, random.Random(seed), fault_rate)
    expression = f"{minute} {hour} * * *"
    schedule = dex.Schedule(
        "p", tick, cron=expression, timezone=tz_name, overlap="allow_all", catchup_window=timedelta(minutes=window)
    )
    expected: list[datetime] = []
    fire = next_cron_fire(expression, zone(tz_name), T0)
    for up, down in segments:
        # an engine comes up (a new one each time: a crash loses everything it held), runs for
        # `up` minutes, then the process dies and nothing runs for `down` minutes
        came_up = clock.now()
        engine = dex.Engine(store, workflows=[tick], schedules=[schedule])  # type: ignore[arg-type]
        end = came_up + timedelta(minutes=up)
        for _ in range(100):  # drain raises the store's error (the clock stays): drain again
            try:
                engine.drain(until=end)
                break
            except ConnectionError:
                continue
        while fire <= end:
            if fire > came_up or came_up - fire < timedelta(minutes=window):
                expected.append(fire)
            fire = next_cron_fire(expression, zone(tz_name), fire)
        clock.advance_to(end + timedelta(minutes=down))
    runs = memory.list_runs(dex.app.ports.store.RunFilter(limit=100_000))
    instance_ids = [run.instance_id for run in runs]
    assert len(instance_ids) == len(set(instance_ids)), "a fire started twice"
    got = sorted(datetime.strptime(i[-20:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for i in instance_ids if i)
    assert got == expected


def test_a_store_failing_mid_step_delays_only_its_fire() -> None:
    clock = VirtualClock(T0)
    memory = InMemoryAdapter(clock=clock)
    failing = {"n": 1}

    class Failing(LossyStore):
        def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
            if advance.name == "a" and failing["n"] > 0:
                failing["n"] -= 1
                raise ConnectionError("injected: the database is unreachable")
            return self._store.advance_schedule(advance, now)

    store = Failing(memory, random.Random(0), 0.0)
    schedules = [dex.Schedule(n, tick, every=timedelta(minutes=1), overlap="allow_all") for n in ("a", "b")]
    engine = dex.Engine(store, workflows=[tick], schedules=schedules)  # type: ignore[arg-type]
    clock.advance(timedelta(minutes=1))
    assert engine.schedules.step() == 1  # "b" fired; "a" failed and is tried again
    assert [r.labels["dex.schedule"] for r in engine.list_runs()] == ["b"]
    healthy = engine.start_workflow(tick)
    engine.drain()  # "a"'s fire is tried again, and starts
    assert engine.get_run(healthy).status is dex.RunStatus.COMPLETED
    names = sorted(r.labels.get("dex.schedule", "") for r in engine.list_runs())
    assert names == ["", "a", "b"]
    assert all(r.status is dex.RunStatus.COMPLETED for r in engine.list_runs())
