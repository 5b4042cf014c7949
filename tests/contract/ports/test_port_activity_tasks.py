"""The ActivityTaskQueue port's contract: activity tasks made claimable, claimed, kept, settled.

docs/reference/contract.md §6 and §8: an activity task is claimed under a short lease (at most its ``lock_timeout``)
that heartbeats extend; when the lease expires the task is taken over as its next attempt, and
an outcome (or heartbeat) of a claim that lost its lease is discarded. A result or a final
failure is a message to the run; a retry is not history, only the task coming back later.
"""

from __future__ import annotations

from datetime import timedelta

import attrs

from dex.app.ports.store import ActivityOutcome, ActivityTask, Claim, Store, WorkflowTask
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    LOCK_TIMEOUT,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    decide,
    done,
    failure,
    finish,
    inbox_of,
    kinds,
    next_task,
    payload,
    start,
    step,
)

SHORT = timedelta(seconds=10)  # an engine's short activity lease, below the tasks' lock_timeout


def _claim(store: Store, clock: VirtualClock, owner: str, lease: timedelta = SHORT) -> list[ActivityTask]:
    return store.claim_activity_tasks(frozenset({ACT}), owner, clock.now(), lease, 8)


class ActivityTaskQueueContract(PortContract):
    def _one_task(self, store: Store, clock: VirtualClock, run_id: str = "r1", **commands: object) -> None:
        start(store, clock, run_id)
        step(store, clock, run_id, activities=[ACT], **commands)

    def test_a_task_carries_what_its_workflow_task_scheduled(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        # the scheduler makes it claimable (a completion may have done so in its own transaction)
        store.schedule_activity_tasks(clock.now(), 100)
        assert store.schedule_activity_tasks(clock.now(), 100) == 0
        (task,) = _claim(store, clock, "a1")
        assert (task.run_id, task.name, task.input, task.attempt) == ("r1", ACT, (payload(ACT),), 1)
        assert (task.lock_timeout, task.queue, task.priority) == (LOCK_TIMEOUT, QUEUE, 0)
        assert task.created_seq == next(
            e.sequence_number for e in store.load_history("r1") if isinstance(e.event, ev.ActivityTaskCreated)
        )
        assert _claim(store, clock, "a2") == []

    def test_a_queue_gives_out_at_most_its_capacity_and_nothing_while_paused(
        self, store: Store, clock: VirtualClock
    ) -> None:
        store.create_queue(QUEUE, "activity", 2)
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT] * 3)
        first, _second = activity(store, clock)
        assert store.schedule_activity_tasks(clock.now(), 100) == 0  # claimed tasks hold their slots
        assert _claim(store, clock, "a2") == []
        assert store.complete_activity_tasks([done(first)], clock.now()) == [True]
        store.set_queue_paused(QUEUE, "activity", True)
        assert store.schedule_activity_tasks(clock.now(), 100) == 0
        store.set_queue_paused(QUEUE, "activity", False)
        assert store.schedule_activity_tasks(clock.now(), 100) == 1
        store.set_queue_paused(QUEUE, "activity", True)
        assert _claim(store, clock, "a2") == []  # a paused queue gives out nothing it holds
        store.set_queue_paused(QUEUE, "activity", False)
        assert len(_claim(store, clock, "a2")) == 1

    def test_a_full_queue_makes_the_best_waiting_task_claimable_first(self, store: Store, clock: VirtualClock) -> None:
        store.create_queue(QUEUE, "activity", 1)
        start(store, clock, "holder")
        step(store, clock, "holder", activities=[ACT])
        (held,) = activity(store, clock)  # the queue's one slot is taken
        for run_id, priority in [("low", 0), ("high", 7), ("later", 7)]:
            start(store, clock, run_id)
            step(store, clock, run_id, activities=[ACT], priority=priority)
        assert store.schedule_activity_tasks(clock.now(), 100) == 0
        assert store.complete_activity_tasks([done(held)], clock.now()) == [True]
        assert [t.run_id for t in activity(store, clock)] == ["high"]

    def test_a_task_due_later_is_claimable_from_its_time_with_its_attempt(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), activities=[ACT])
        # a retry of a first attempt that ran inside the workflow task: attempt 2, after its delay
        due = clock.now() + timedelta(seconds=20)
        (spec,) = result.activity_tasks
        result = attrs.evolve(result, activity_tasks=(attrs.evolve(spec, visible_from=due, attempt=2),))
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        assert activity(store, clock) == []
        assert store.next_due_time(clock.now()) == due
        clock.advance_to(due)
        (claimed,) = activity(store, clock)
        assert (claimed.run_id, claimed.attempt) == ("r1", 2)

    def test_tasks_are_claimed_highest_priority_first_then_oldest(self, store: Store, clock: VirtualClock) -> None:
        for run_id, priority in [("a", 0), ("b", 5), ("c", 0)]:
            start(store, clock, run_id)
            step(store, clock, run_id, activities=[ACT], priority=priority)
            clock.advance(1)
        store.schedule_activity_tasks(clock.now(), 100)
        order = [t.run_id for _ in range(3) for t in store.claim_activity_tasks({ACT}, "a1", clock.now(), SHORT, 1)]
        assert order == ["b", "a", "c"]
        assert store.claim_activity_tasks({"other"}, "a1", clock.now(), SHORT, 8) == []

    def test_a_claim_s_lease_is_the_shorter_of_the_lease_and_the_lock_timeout(
        self, store: Store, clock: VirtualClock
    ) -> None:
        self._one_task(store, clock, "r1")
        self._one_task(store, clock, "r2")
        store.schedule_activity_tasks(clock.now(), 100)
        (short,) = store.claim_activity_tasks({ACT}, "a1", clock.now(), SHORT, 1)
        (long,) = store.claim_activity_tasks({ACT}, "a1", clock.now(), LOCK_TIMEOUT * 3, 1)
        assert (short.lease.owner, short.lease.until) == ("a1", clock.now() + SHORT)
        assert long.lease.until == clock.now() + LOCK_TIMEOUT

    def test_an_expired_lease_is_taken_over_as_the_next_attempt(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (lost,) = activity(store, clock, owner="a1")
        clock.advance(LEASE - timedelta(seconds=1))
        assert _claim(store, clock, "a2") == []
        clock.advance(1)
        (taken,) = _claim(store, clock, "a2")
        assert (taken.task_id, taken.attempt, taken.lease.owner) == (lost.task_id, 2, "a2")
        assert taken.lease.version > lost.lease.version
        # the lost claim can neither keep nor settle the task
        assert store.extend_activity_leases([lost], clock.now(), SHORT) == [False]
        assert store.complete_activity_tasks([done(lost)], clock.now()) == [False]
        assert inbox_of(store, clock, "r1") == []
        assert store.complete_activity_tasks([done(taken)], clock.now()) == [True]

    def test_a_heartbeat_keeps_the_lease_of_the_claim_that_holds_it(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        clock.advance(SHORT - timedelta(seconds=1))
        assert store.extend_activity_leases([task], clock.now(), SHORT) == [True]
        clock.advance(SHORT - timedelta(seconds=1))  # past the first lease, within the second
        assert _claim(store, clock, "a2") == []
        assert store.extend_activity_leases([task], clock.now(), LOCK_TIMEOUT * 3) == [True]
        clock.advance(LOCK_TIMEOUT - timedelta(seconds=1))  # extended by at most the lock_timeout
        assert _claim(store, clock, "a2") == []
        clock.advance(1)
        assert len(_claim(store, clock, "a2")) == 1
        assert store.extend_activity_leases([], clock.now(), SHORT) == []

    def test_a_heartbeat_for_a_settled_task_is_refused(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        finished, running = activity(store, clock)
        assert store.complete_activity_tasks([done(finished)], clock.now()) == [True]
        assert store.extend_activity_leases([finished, running], clock.now(), SHORT) == [False, True]

    def test_a_result_or_a_final_failure_is_a_message_to_the_run(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        ok, bad = activity(store, clock)
        outcomes = [done(ok, 7), ActivityOutcome(task=bad, failure=failure())]
        assert store.complete_activity_tasks(outcomes, clock.now()) == [True, True]
        _history, inbox = store.load_workflow_task(_task(store, clock, "r1"), clock.now())
        assert [m.event for m in inbox] == [
            ev.ActivityTaskCompleted(created_seq=ok.created_seq, result=payload(7)),
            ev.ActivityTaskFailed(created_seq=bad.created_seq, failure=failure()),
        ]
        # settled once: a second outcome of the same claim is discarded, and the task is gone
        assert store.complete_activity_tasks([done(ok, 8)], clock.now()) == [False]
        clock.advance(LOCK_TIMEOUT)
        assert activity(store, clock) == []

    def test_a_retry_brings_the_task_back_later_as_its_next_attempt(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        retry_at = clock.now() + timedelta(seconds=30)
        retry = ActivityOutcome(task=task, failure=failure("try again"), retry_at=retry_at)
        assert store.complete_activity_tasks([retry], clock.now()) == [True]
        assert inbox_of(store, clock, "r1") == []  # a retried attempt is not history
        assert store.complete_activity_tasks([done(task)], clock.now()) == [False]
        clock.advance(29)
        assert activity(store, clock) == []
        assert store.next_due_time(clock.now()) == retry_at
        clock.advance(1)
        (again,) = activity(store, clock, owner="a2")
        assert (again.task_id, again.attempt) == (task.task_id, 2)

    def test_a_retry_that_does_not_count_brings_the_same_attempt_back(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        given_back = ActivityOutcome(task=task, retry_at=clock.now() + timedelta(seconds=2), counts=False)
        mixed = [given_back, ActivityOutcome(task=task, failure=failure(), retry_at=clock.now())]
        assert store.complete_activity_tasks(mixed, clock.now()) == [True, False]  # the lease is used up once
        assert inbox_of(store, clock, "r1") == []
        clock.advance(2)
        (again,) = activity(store, clock, owner="a2")
        assert (again.task_id, again.attempt, again.lease.owner) == (task.task_id, 1, "a2")  # not its next attempt
        assert again.lease.version > task.lease.version  # a claim all the same: the old lease is dead
        assert store.complete_activity_tasks([done(task)], clock.now()) == [False]
        counted = ActivityOutcome(task=again, failure=failure(), retry_at=clock.now())
        assert store.complete_activity_tasks([counted], clock.now()) == [True]
        (third,) = activity(store, clock, owner="a3")
        assert third.attempt == 2

    def test_an_attempt_of_a_run_that_ended_is_discarded(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        finish(store, clock, "r1", RunStatus.CANCELLED)
        assert store.complete_activity_tasks([done(task)], clock.now()) == [False]
        assert store.extend_activity_leases([task], clock.now(), SHORT) == [False]

    # -- complete, then claim ------------------------------------------------------------------------
    def test_an_outcome_claims_the_workflow_task_of_the_run_it_answered(
        self, store: Store, clock: VirtualClock
    ) -> None:
        self._one_task(store, clock)
        last = store.load_history("r1")[-1].sequence_number
        (task,) = activity(store, clock)
        claim = Claim(names=frozenset({WF}), owner="eager", limit=4, lease=LEASE, after_seqs={"r1": last})
        applied, (claimed,), (loaded,) = store.complete_activity_tasks_then_claim([done(task)], clock.now(), claim)
        assert applied == [True]
        assert (claimed.run_id, claimed.lease.owner, claimed.lease.until) == ("r1", "eager", clock.now() + LEASE)
        assert not isinstance(loaded, Exception)
        assert [e.sequence_number for e in loaded.events] == [last]
        assert kinds(loaded.inbox) == ["ActivityTaskCompleted"]
        assert store.load_workflow_tasks([(claimed, last)], clock.now()) == [loaded]
        assert store.claim_workflow_tasks({WF}, "other", clock.now(), LEASE, 4) == []

    def test_an_outcome_without_after_seqs_claims_without_loading(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        claim = Claim(names=frozenset({WF}), owner="eager", limit=4, lease=LEASE)
        applied, claimed, loaded = store.complete_activity_tasks_then_claim([done(task)], clock.now(), claim)
        assert (applied, [t.run_id for t in claimed], loaded) == ([True], ["r1"], [])

    def test_a_retry_or_a_discarded_outcome_claims_nothing(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        claim = Claim(names=frozenset({WF}), owner="eager", limit=4, lease=LEASE)
        retry = ActivityOutcome(task=task, failure=failure(), retry_at=clock.now())
        assert store.complete_activity_tasks_then_claim([retry], clock.now(), claim) == ([True], [], [])
        assert store.complete_activity_tasks_then_claim([done(task)], clock.now(), claim) == ([False], [], [])
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0  # the run got nothing to do


def _task(store: Store, clock: VirtualClock, run_id: str) -> WorkflowTask:
    store.schedule_workflow_tasks(clock.now(), 100)
    (task,) = store.claim_workflow_tasks({WF}, "w1", clock.now(), LEASE, 8)
    assert task.run_id == run_id
    return task


class TestActivityTaskQueueMemory(MemoryBackend, ActivityTaskQueueContract):
    pass


class TestActivityTaskQueuePostgres(PostgresBackend, ActivityTaskQueueContract):
    pass
