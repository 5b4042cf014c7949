"""The contract of a queue's key concurrency and rate limit, on every adapter
(docs/reference/contract.md §15, the queues bullet).

Each adapter is checked against the rules as :mod:`dex.domain.queue_limits` states them: a key
is granted to ``key_grants(key_concurrency, here, elsewhere, alone_elsewhere)`` more runs of a
queue (a queue with key concurrency 1 takes it only while nobody holds it, a queue with n > 1
counts its own holders); a start slot is free when
``slot_is_free(last_start, now, period)``, at the boundary too (a start exactly one period
after the last one through a slot is allowed, one microsecond earlier is not).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest

from dex.app.ports.store import ActivitySlots, Claim, QueueInfo, Store
from dex.domain.queue_limits import RateLimit, key_grants, key_holders, slot_is_free
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    claim,
    created,
    decide,
    done,
    next_task,
    start,
)

TICK = timedelta(microseconds=1)
PERIOD = timedelta(seconds=10)


def queue_info(store: Store, name: str = QUEUE, kind: str = "workflow") -> QueueInfo:
    return next(q for q in store.list_queues() if (q.name, q.kind) == (name, kind))


def scheduled(store: Store, clock: VirtualClock) -> set[str]:
    """The runs whose workflow task the scheduler creates now (they are claimed and given back:
    the caller sees which runs were granted, the store keeps the tasks)."""
    store.schedule_workflow_tasks(clock.now(), 100)
    tasks = claim(store, clock, owner="peek")
    assert store.retry_workflow_tasks([(t, clock.now()) for t in tasks], clock.now()) == [True] * len(tasks)
    return {t.run_id for t in tasks}


def end(store: Store, clock: VirtualClock, runs: set[str]) -> None:
    """Complete the given runs (their tasks claimed and completed); other tasks claimed on the
    way are given back."""
    for task in claim(store, clock, owner="ender"):
        if task.run_id in runs:
            result = decide(store, task, clock.now(), complete=RunStatus.COMPLETED)
            assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        else:
            assert store.retry_workflow_tasks([(task, clock.now())], clock.now()) == [True]


class QueueLimitsContract(PortContract):
    # -- settings --------------------------------------------------------------------------------
    def test_a_queue_has_key_concurrency_1_and_no_rate_limit_by_default(self, store: Store) -> None:
        store.ensure_queue("plain", "workflow")
        info = queue_info(store, "plain")
        assert (info.key_concurrency, info.rate_limit) == (1, None)

    def test_create_and_set_give_the_settings_that_list_queues_shows(self, store: Store) -> None:
        store.create_queue("tenants", "workflow", 7, 3, RateLimit(5, PERIOD))
        info = queue_info(store, "tenants")
        assert (info.capacity, info.key_concurrency, info.rate_limit) == (7, 3, (5, PERIOD))
        store.set_queue_key_concurrency("tenants", "workflow", 2)
        store.set_queue_rate_limit("tenants", "workflow", RateLimit(1, timedelta(minutes=1)))
        info = queue_info(store, "tenants")
        assert (info.capacity, info.key_concurrency, info.rate_limit) == (7, 2, (1, timedelta(minutes=1)))
        store.set_queue_rate_limit("tenants", "workflow", None)
        assert queue_info(store, "tenants").rate_limit is None
        # create_queue on an existing queue gives it every setting it names, defaults included
        store.create_queue("tenants", "workflow", 9)
        info = queue_info(store, "tenants")
        assert (info.capacity, info.key_concurrency, info.rate_limit) == (9, 1, None)

    def test_setting_a_limit_of_a_queue_that_does_not_exist_is_refused(self, store: Store) -> None:
        with pytest.raises(ValueError, match="there is no workflow queue named 'ghost'"):
            store.set_queue_key_concurrency("ghost", "workflow", 2)
        with pytest.raises(ValueError, match="there is no activity queue named 'ghost'"):
            store.set_queue_rate_limit("ghost", "activity", RateLimit(1, PERIOD))
        assert "ghost" not in {q.name for q in store.list_queues()}

    # -- key concurrency --------------------------------------------------------------------------
    def test_key_concurrency_grants_a_key_to_that_many_runs_in_order(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, 2)
        for n, priority in enumerate((0, 5, 0, 9)):
            start(store, clock, f"r{n}", key="tenant-a", priority=priority)
            clock.advance(TICK)
        start(store, clock, "other", key="tenant-b")
        assert key_grants(2, 0, 0, 0) == 2
        # the two best of tenant-a (highest priority first), and tenant-b's own
        assert scheduled(store, clock) == {"r3", "r1", "other"}
        # one holder ends: one more grant, to the best of those left (then the oldest)
        task = next_task(store, clock, "r3")
        assert store.complete_workflow_tasks(
            [(task, decide(store, task, clock.now(), complete=RunStatus.COMPLETED))], clock.now()
        )
        assert key_grants(2, 1, 0, 0) == 1
        assert scheduled(store, clock) - {"r1", "other"} == {"r0"}

    def test_key_concurrency_1_keeps_one_run_per_key_at_a_time(self, store: Store, clock: VirtualClock) -> None:
        for n in range(3):
            start(store, clock, f"r{n}", key="k")
            clock.advance(TICK)
        assert scheduled(store, clock) == {"r0"}

    def test_raising_key_concurrency_grants_more_at_the_next_round(self, store: Store, clock: VirtualClock) -> None:
        for n in range(4):
            start(store, clock, f"r{n}", key="k")
            clock.advance(TICK)
        assert scheduled(store, clock) == {"r0"}
        store.set_queue_key_concurrency(QUEUE, "workflow", 3)
        assert scheduled(store, clock) == {"r0", "r1", "r2"}

    def test_key_concurrency_1_keeps_one_run_per_key_across_queues(self, store: Store, clock: VirtualClock) -> None:
        store.ensure_queue("other", "workflow")
        for n, queue in enumerate((QUEUE, "other", QUEUE, "other")):
            start(store, clock, f"r{n}", key="k", queue=queue)
            clock.advance(TICK)
        assert scheduled(store, clock) == {"r0"}
        end(store, clock, {"r0"})
        assert scheduled(store, clock) == {"r1"}  # the next of the key, on the other queue

    def test_two_queues_sharing_a_key_each_keep_their_own_key_concurrency(
        self, store: Store, clock: VirtualClock
    ) -> None:
        """A queue with key concurrency 3 grants the key to 3 of its own runs; a queue with 1
        grants it only while nobody holds it, and while its run holds it nobody else is granted it."""
        store.create_queue("wide", "workflow", 100, 3)
        store.ensure_queue("solo", "workflow")
        for run, queue in (("w0", "wide"), ("w1", "wide"), ("s0", "solo"), ("w2", "wide"), ("w3", "wide")):
            start(store, clock, run, key="k", queue=queue)
            clock.advance(TICK)
        assert key_grants(3, *key_holders({}, {"wide": 3}, "wide")) == 3
        assert key_grants(1, *key_holders({"wide": 3}, {"wide": 3}, "solo")) == 0
        # wide's first three, in order; solo's run waits while the key is held anywhere
        assert scheduled(store, clock) == {"w0", "w1", "w2"}
        end(store, clock, {"w0"})
        assert key_grants(3, *key_holders({"wide": 2}, {"wide": 3}, "wide")) == 1
        assert scheduled(store, clock) == {"w1", "w2", "w3"}
        end(store, clock, {"w1", "w2", "w3"})
        # nobody holds the key: solo's run, the best left, takes it alone
        assert scheduled(store, clock) == {"s0"}
        start(store, clock, "w4", key="k", queue="wide")
        assert key_grants(3, *key_holders({"solo": 1}, {"wide": 3, "solo": 1}, "wide")) == 0
        assert scheduled(store, clock) == {"s0"}  # wide grants nothing while solo's run holds the key
        end(store, clock, {"s0"})
        assert scheduled(store, clock) == {"w4"}

    @pytest.mark.parametrize("seed", range(4))
    def test_scheduling_follows_the_domain_rules(self, store: Store, clock: VirtualClock, seed: int) -> None:
        """Random runs (keys, priorities), a random key concurrency, rounds that end random
        holders: each round grants what a model built from queue_limits grants."""
        rng = random.Random(seed)
        k = rng.randint(1, 3)
        store.create_queue(QUEUE, "workflow", 100, k)
        order: list[tuple[int, int, str, str | None]] = []  # RUN_ORDER: -priority, then creation
        for n in range(rng.randint(8, 16)):
            key, priority = rng.choice(["a", "b", "c", None]), rng.randint(0, 3)
            start(store, clock, f"r{n}", key=key, priority=priority)
            order.append((-priority, n, f"r{n}", key))
            clock.advance(TICK)
        order.sort()
        granted: set[str] = set()
        for _round in range(6):
            holders = Counter(key for _p, _n, run, key in order if run in granted and key is not None)
            for _p, _n, run, key in order:
                if run in granted:
                    continue
                if key is None or key_grants(k, *key_holders({QUEUE: holders[key]}, {QUEUE: k}, QUEUE)) > 0:
                    granted.add(run)
                    holders[key] += key is not None
            assert scheduled(store, clock) == granted
            ending = {run for run in granted if rng.random() < 0.5}
            tasks = claim(store, clock, owner="ender")
            for task in tasks:
                if task.run_id in ending:
                    result = decide(store, task, clock.now(), complete=RunStatus.COMPLETED)
                    assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
                else:
                    assert store.retry_workflow_tasks([(task, clock.now())], clock.now()) == [True]
            granted -= ending
            order = [entry for entry in order if entry[2] not in ending]

    # -- rate limits: workflow tasks ----------------------------------------------------------------
    def test_a_rate_limit_lets_n_workflow_tasks_start_per_window(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(2, PERIOD))
        for n in range(5):
            start(store, clock, f"r{n}")
        assert store.schedule_workflow_tasks(clock.now(), 100) == 5  # scheduling is not limited
        first = clock.now()
        assert len(claim(store, clock)) == 2
        clock.advance(PERIOD - TICK)
        assert not slot_is_free(first, clock.now(), PERIOD)
        assert claim(store, clock) == []
        clock.advance(TICK)
        assert slot_is_free(first, clock.now(), PERIOD)
        assert len(claim(store, clock)) == 2
        assert claim(store, clock) == []

    def test_the_window_slides_no_burst_above_n(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(2, PERIOD))
        for n in range(6):
            start(store, clock, f"r{n}")
        store.schedule_workflow_tasks(clock.now(), 100)
        begin, starts = clock.now(), []
        for _ in range(41):  # every half second for 20 s, one task at a time
            for _task in claim(store, clock, limit=1):
                starts.append(clock.now() - begin)
            clock.advance(PERIOD / 20)
        # at most 2 in any window of 10 s, whichever moment it begins at
        assert all(sum(1 for s in starts if t <= s < t + PERIOD) <= 2 for t in starts)
        seconds = [s.total_seconds() for s in starts]
        assert seconds == [0, 0.5, 10, 10.5, 20]

    def test_a_rate_limited_queue_is_claimed_only_through_its_slots(self, store: Store, clock: VirtualClock) -> None:
        """No path starts a task of it without a slot: a new run's first task is not claimed
        with its creation, and other queues are claimed as before."""
        store.create_queue("limited", "workflow", 100, rate_limit=RateLimit(1, PERIOD))
        eager = Claim(names=frozenset({WF}), owner="eager", limit=8, lease=LEASE)
        assert store.create_run_then_claim("a", created(queue="limited"), clock.now(), eager)[1:] == ([], [])
        start(store, clock, "b", queue="limited")
        start(store, clock, "free")
        store.schedule_workflow_tasks(clock.now(), 100)
        assert sorted(t.run_id for t in claim(store, clock)) == ["a", "free"]
        assert claim(store, clock) == []
        clock.advance(PERIOD)
        assert [t.run_id for t in claim(store, clock)] == ["b"]

    def test_removing_the_rate_limit_claims_everything_at_once(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(1, PERIOD))
        for n in range(3):
            start(store, clock, f"r{n}")
        store.schedule_workflow_tasks(clock.now(), 100)
        assert len(claim(store, clock)) == 1
        store.set_queue_rate_limit(QUEUE, "workflow", None)
        assert len(claim(store, clock)) == 2

    def test_lowering_the_count_keeps_the_recent_starts(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(3, PERIOD))
        for n in range(5):
            start(store, clock, f"r{n}")
        store.schedule_workflow_tasks(clock.now(), 100)
        assert len(claim(store, clock)) == 3
        store.set_queue_rate_limit(QUEUE, "workflow", RateLimit(1, PERIOD))
        clock.advance(PERIOD / 2)
        assert claim(store, clock) == []  # the slot kept started a task 5 s ago
        clock.advance(PERIOD / 2)
        assert len(claim(store, clock)) == 1

    def test_a_paused_rate_limited_queue_starts_nothing(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(5, PERIOD))
        start(store, clock, "r1")
        store.schedule_workflow_tasks(clock.now(), 100)
        store.set_queue_paused(QUEUE, "workflow", True)
        assert claim(store, clock) == []
        assert queue_info(store).status == "PAUSED"
        store.set_queue_paused(QUEUE, "workflow", False)
        assert queue_info(store).status == "ACTIVE"
        assert len(claim(store, clock)) == 1

    def test_the_next_due_time_is_when_a_slot_frees_up(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "workflow", 100, rate_limit=RateLimit(1, PERIOD))
        start(store, clock, "r1")
        start(store, clock, "r2")
        store.schedule_workflow_tasks(clock.now(), 100)
        first = clock.now()
        assert len(claim(store, clock)) == 1
        assert store.next_due_time(clock.now()) == first + PERIOD

    # -- rate limits: activity tasks ----------------------------------------------------------------
    def test_a_rate_limit_lets_n_activity_tasks_start_per_window(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        store.create_queue("api", "activity", 100, rate_limit=RateLimit(2, PERIOD))
        result = decide(store, task, clock.now(), activities=[ACT] * 5, queue="api")
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        got = activity(store, clock)
        assert len(got) == 2
        # a rate-limited queue runs nothing inline: its slots say it is held back
        assert store.activity_slots() == [ActivitySlots(queue="api", paused=True, capacity=100, held=5)]
        clock.advance(PERIOD - TICK)
        assert activity(store, clock) == []
        clock.advance(TICK)
        more = activity(store, clock)
        assert len(more) == 2
        assert store.complete_activity_tasks([done(t) for t in got + more], clock.now()) == [True] * 4


class TestQueueLimitsMemory(MemoryBackend, QueueLimitsContract):
    pass


class TestQueueLimitsPostgres(PostgresBackend, QueueLimitsContract):
    pass
