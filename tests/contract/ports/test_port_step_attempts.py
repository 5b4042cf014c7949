"""The AttemptReads port's contract: what a store keeps of an activity step's attempts.

docs/reference/contract.md §8: a retried attempt is not history, so the store keeps, with the
retry that reschedules the task, the attempt's failure; and with the claim that takes over a
task whose lease expired, the attempt that was lost. Per step: the counts, the newest
``MAX_RECENT_ATTEMPTS`` of them (newest first), the number of the next attempt, and while the
task exists, where it stands (waiting for a retry from ``visible_from``, or running under a
lease). Nothing is kept of an attempt that succeeds.
"""

from __future__ import annotations

from datetime import timedelta

from dex.app.ports.attempts import FAILED, LEASE_EXPIRED, LOST, MAX_RECENT_ATTEMPTS
from dex.app.ports.store import ActivityOutcome, ActivityTask, Store
from dex.domain.status import RunStatus
from dex.domain.values import MAX_FAILURE_TEXT, FailureInfo
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
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

SHORT = timedelta(seconds=10)


def _retry(store: Store, clock: VirtualClock, task: ActivityTask, message: str, after: float = 5) -> None:
    outcome = ActivityOutcome(task=task, failure=failure(message), retry_at=clock.now() + timedelta(seconds=after))
    assert store.complete_activity_tasks([outcome], clock.now()) == [True]


class StepAttemptsContract(PortContract):
    def _one_task(self, store: Store, clock: VirtualClock, run_id: str = "r1") -> int:
        start(store, clock, run_id)
        step(store, clock, run_id, activities=[ACT])
        return store.load_history(run_id)[-1].sequence_number - 1  # its ActivityTaskCreated

    def test_a_step_whose_first_attempt_succeeds_leaves_nothing(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        (running,) = store.step_attempts("r1")
        assert (running.failed, running.lost, running.recent, running.next_attempt) == (0, 0, (), 1)
        assert running.pending is not None
        assert (running.pending.attempt, running.pending.state) == (1, "running")
        assert running.pending.lease_until == task.lease.until
        assert store.complete_activity_tasks([done(task)], clock.now()) == [True]
        assert store.step_attempts("r1") == []  # no write for a successful attempt
        assert store.step_attempts("no-such-run") == []

    def test_a_failed_attempt_is_kept_with_its_retry(self, store: Store, clock: VirtualClock) -> None:
        seq = self._one_task(store, clock)
        (task,) = activity(store, clock)
        failed_at = clock.now()
        _retry(store, clock, task, "gateway timeout", after=30)
        (kept,) = store.step_attempts("r1")
        assert kept.created_seq == seq
        assert (kept.failed, kept.lost, kept.next_attempt) == (1, 0, 2)
        (only,) = kept.recent
        assert (only.attempt, only.kind, only.at, only.failure.message) == (1, FAILED, failed_at, "gateway timeout")
        assert kept.pending is not None
        assert (kept.pending.attempt, kept.pending.state) == (2, "waiting")
        assert kept.pending.visible_from == failed_at + timedelta(seconds=30)  # the next retry
        # the step's success writes nothing more, and what was kept stays (its task is gone)
        clock.advance(30)
        (again,) = activity(store, clock)
        assert store.complete_activity_tasks([done(again)], clock.now()) == [True]
        (after,) = store.step_attempts("r1")
        assert (after.failed, after.next_attempt, after.pending) == (1, 2, None)
        assert after.recent == kept.recent

    def test_only_the_newest_failures_are_kept_newest_first(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        total = MAX_RECENT_ATTEMPTS + 3
        for n in range(1, total + 1):
            (task,) = activity(store, clock)
            assert task.attempt == n
            _retry(store, clock, task, f"failure {n}", after=1)
            clock.advance(1)
        (kept,) = store.step_attempts("r1")
        assert (kept.failed, kept.next_attempt) == (total, total + 1)
        assert [a.attempt for a in kept.recent] == list(range(total, total - MAX_RECENT_ATTEMPTS, -1))
        assert [a.failure.message for a in kept.recent] == [f"failure {n}" for n in range(total, 3, -1)]

    def test_a_retry_that_does_not_count_is_not_a_failed_attempt(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        given_back = ActivityOutcome(task=task, retry_at=clock.now(), counts=False)
        assert store.complete_activity_tasks([given_back], clock.now()) == [True]
        (kept,) = store.step_attempts("r1")
        assert (kept.failed, kept.recent) == (0, ())
        assert kept.pending is not None and kept.pending.attempt == 1

    def test_an_attempt_lost_to_an_expired_lease_is_kept_by_the_claim_that_takes_it_over(
        self, store: Store, clock: VirtualClock
    ) -> None:
        self._one_task(store, clock)
        store.schedule_activity_tasks(clock.now(), 100)
        (lost,) = store.claim_activity_tasks({ACT}, "dead", clock.now(), SHORT, 8)  # then its worker dies
        clock.advance(SHORT)
        (taken,) = store.claim_activity_tasks({ACT}, "survivor", clock.now(), SHORT, 8)
        assert taken.attempt == 2
        (kept,) = store.step_attempts("r1")
        assert (kept.failed, kept.lost, kept.next_attempt) == (0, 1, 2)
        (only,) = kept.recent
        assert (only.attempt, only.kind, only.at) == (1, LOST, lost.lease.until)
        assert only.failure.type == LEASE_EXPIRED
        assert "attempt 1 started but never reported" in only.failure.message
        assert kept.pending is not None
        assert (kept.pending.attempt, kept.pending.state, kept.pending.lease_until) == (2, "running", taken.lease.until)
        # then a failure of the attempt that took over: both, newest first
        _retry(store, clock, taken, "declined")
        (both,) = store.step_attempts("r1")
        assert (both.failed, both.lost, both.next_attempt) == (1, 1, 3)
        assert [(a.attempt, a.kind) for a in both.recent] == [(2, FAILED), (1, LOST)]

    def test_each_step_has_its_own_attempts(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        first, second = activity(store, clock)
        _retry(store, clock, first, "first failed")
        assert store.complete_activity_tasks([done(second)], clock.now()) == [True]
        (kept,) = store.step_attempts("r1")
        assert kept.created_seq == first.created_seq
        assert kept.recent[0].failure.message == "first failed"

    def test_the_steps_asked_for_only(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT, ACT])
        first, second, third = sorted(activity(store, clock), key=lambda t: t.created_seq)
        _retry(store, clock, first, "first failed")
        assert store.complete_activity_tasks([done(third)], clock.now()) == [True]
        whole = store.step_attempts("r1")
        assert [s.created_seq for s in whole] == [first.created_seq, second.created_seq]  # the third left nothing
        assert store.step_attempts("r1", [second.created_seq, third.created_seq]) == [whole[1]]
        assert store.step_attempts("r1", [first.created_seq, 2**40, -1]) == [whole[0]]  # none such: none
        assert store.step_attempts("r1", []) == []
        assert store.step_attempts("r1", None) == whole

    def test_the_attempts_go_with_their_run(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        _retry(store, clock, task, "x")
        finish(store, clock, "r1", RunStatus.CANCELLED)
        (kept,) = store.step_attempts("r1")  # kept while the run is kept: its page shows them
        assert kept.pending is None  # the run's end dropped its task
        clock.advance(LEASE)
        assert store.delete_finished_runs(clock.now(), 10) == 1
        assert store.step_attempts("r1") == []

    def test_a_failure_with_hostile_text_is_kept_bounded_and_readable(self, store: Store, clock: VirtualClock) -> None:
        self._one_task(store, clock)
        (task,) = activity(store, clock)
        hostile = FailureInfo(type="Bad\x00Type", message="nul \x00 and a lone \ud800 surrogate " + "x" * 200_000)
        outcome = ActivityOutcome(task=task, failure=hostile, retry_at=clock.now())
        assert store.complete_activity_tasks([outcome], clock.now()) == [True]
        (kept,) = store.step_attempts("r1")
        (only,) = kept.recent
        assert only.failure == hostile  # what FailureInfo made storable comes back as it was (a NUL too)
        assert "\ud800" not in only.failure.message
        assert "[truncated: " in only.failure.message
        assert len(only.failure.message) <= MAX_FAILURE_TEXT


class TestStepAttemptsMemory(MemoryBackend, StepAttemptsContract):
    pass


class TestStepAttemptsPostgres(PostgresBackend, StepAttemptsContract):
    pass
