"""The remote workers' part of the ActivityTaskQueue port (docs/reference/contract.md §13), on every adapter.

A remote worker claims by a list of names under a lease of its own, and names a task in every
later call by its id and lease version: ``find_activity_tasks`` finds the task as it stands
(its current lease), and the ordinary writes check that lease again. A task named by no claim
is never claimed, whatever else the store holds.
"""

from __future__ import annotations

from datetime import timedelta

from dex.app.ports.store import ActivityOutcome, Store
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    done,
    failure,
    finish,
    start,
    step,
)

REMOTE = "resize-image"  # a name no engine in these tests registers
SHORT = timedelta(seconds=5)


class RemoteTasksContract(PortContract):
    def _tasks(self, store: Store, clock: VirtualClock, run_id: str = "r1") -> None:
        start(store, clock, run_id)
        step(store, clock, run_id, activities=[ACT, REMOTE])
        store.schedule_activity_tasks(clock.now(), 100)

    def test_a_claim_takes_only_the_names_it_lists(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (mine,) = store.claim_activity_tasks(frozenset({ACT}), "engine", clock.now(), SHORT, 10)
        assert mine.name == ACT
        assert store.claim_activity_tasks(frozenset({ACT, "other"}), "engine", clock.now(), SHORT, 10) == []
        (remote,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-1", clock.now(), SHORT, 10)
        assert (remote.name, remote.lease.owner, remote.lease.until) == (REMOTE, "remote-1", clock.now() + SHORT)

    def test_find_gives_a_claimed_task_with_its_current_lease(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (remote,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-1", clock.now(), SHORT, 10)
        (found,) = store.find_activity_tasks([remote.task_id])
        assert found == remote
        clock.advance(timedelta(seconds=2))
        assert store.extend_activity_leases([remote], clock.now(), SHORT) == [True]
        (found,) = store.find_activity_tasks([remote.task_id])
        assert found is not None and found.lease.until == clock.now() + SHORT
        assert found.lease.version == remote.lease.version

    def test_find_gives_none_for_unclaimed_finished_and_unknown_tasks(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (local,) = store.claim_activity_tasks(frozenset({ACT}), "engine", clock.now(), SHORT, 10)
        unclaimed = local.task_id + 1 if local.name == ACT else local.task_id - 1
        assert store.find_activity_tasks([unclaimed, 10**12]) == [None, None]  # QUEUED, no lease; no such task
        assert store.complete_activity_tasks([done(local)], clock.now()) == [True]
        assert store.find_activity_tasks([local.task_id]) == [None]
        assert store.find_activity_tasks([]) == []

    def test_a_retried_task_is_not_found_until_claimed_again(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (remote,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-1", clock.now(), SHORT, 10)
        retry = ActivityOutcome(task=remote, failure=failure(), retry_at=clock.now() + SHORT)
        assert store.complete_activity_tasks([retry], clock.now()) == [True]
        assert store.find_activity_tasks([remote.task_id]) == [None]
        clock.advance(SHORT)
        store.schedule_activity_tasks(clock.now(), 100)
        (again,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-2", clock.now(), SHORT, 10)
        assert (again.task_id, again.attempt) == (remote.task_id, 2)
        assert store.find_activity_tasks([remote.task_id]) == [again]

    def test_a_lapsed_lease_taken_over_refuses_the_old_holder(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (first,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-1", clock.now(), SHORT, 10)
        clock.advance(SHORT)
        (second,) = store.claim_activity_tasks(frozenset({REMOTE}), "remote-2", clock.now(), SHORT, 10)
        assert (second.attempt, second.lease.version) == (2, first.lease.version + 1)
        (found,) = store.find_activity_tasks([first.task_id])
        assert found is not None and found.lease.owner == "remote-2"
        assert store.extend_activity_leases([first], clock.now(), SHORT) == [False]
        assert store.complete_activity_tasks([done(first)], clock.now()) == [False]
        assert store.complete_activity_tasks([done(second)], clock.now()) == [True]

    def test_a_run_that_ends_takes_its_tasks_with_it(self, store: Store, clock: VirtualClock) -> None:
        self._tasks(store, clock)
        (remote,) = activity(store, clock, owner="remote-1", names=(REMOTE,))
        finish(store, clock, "r1", RunStatus.CANCELLED)
        assert store.find_activity_tasks([remote.task_id]) == [None]
        assert store.extend_activity_leases([remote], clock.now(), SHORT) == [False]


class TestRemoteTasksMemory(MemoryBackend, RemoteTasksContract):
    pass


class TestRemoteTasksPostgres(PostgresBackend, RemoteTasksContract):
    pass
