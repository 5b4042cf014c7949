"""ActivityLeases: which leases a step extends, and when an attempt is past its deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dex.app.activities.leases import ActivityLeases
from dex.app.ports.store import ActivityTask, Lease
from dex.domain.retry import RetryPolicy

T0 = datetime(2024, 1, 1, tzinfo=UTC)
SHORT = timedelta(seconds=30)


def _task(task_id: int, lock_timeout: timedelta, version: int = 1) -> ActivityTask:
    return ActivityTask(
        task_id=task_id, run_id=f"run-{task_id}", created_seq=3, name="act", input=(), queue="default",
        priority=0, attempt=1, retry_policy=RetryPolicy(), lock_timeout=lock_timeout,
        lease=Lease(owner="me", until=T0 + min(lock_timeout, SHORT), version=version),
    )  # fmt: skip


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_running_attempts_are_extended_together_a_third_of_a_lease_apart() -> None:
    leases = ActivityLeases(SHORT)
    first, second = _task(1, timedelta(minutes=5)), _task(2, timedelta(minutes=5))
    with leases.running(first, _at(0)), leases.running(second, _at(4)):
        assert leases.step(_at(5)).extend == ()  # not due yet: the claim's lease is fresh
        assert {t.task_id for t in leases.step(_at(10)).extend} == {1, 2}  # one batch
        assert leases.step(_at(19)).extend == ()
        assert {t.task_id for t in leases.step(_at(20)).extend} == {1, 2}
    assert len(leases) == 0
    assert leases.step(_at(100)).extend == ()  # ended attempts are not extended


def test_an_attempt_with_a_shorter_lease_brings_the_next_round_forward() -> None:
    leases = ActivityLeases(SHORT)
    with leases.running(_task(1, timedelta(minutes=5)), _at(0)):
        with leases.running(_task(2, timedelta(seconds=6)), _at(1)):  # its lease: 6 s
            assert [t.task_id for t in leases.step(_at(3)).extend] == [1, 2]
            assert leases.step(_at(4)).extend == ()
            assert len(leases.step(_at(5)).extend) == 2


def test_lock_timeout_bounds_an_attempt_from_its_start_or_its_last_heartbeat() -> None:
    leases = ActivityLeases(SHORT)
    quiet, beating = _task(1, timedelta(seconds=60)), _task(2, timedelta(seconds=60))
    with leases.running(quiet, _at(0)), leases.running(beating, _at(0)):
        assert leases.heartbeat(beating, _at(50))  # its deadline moves to 110 s
        decided = leases.step(_at(59))
        assert decided.overdue == () and len(decided.extend) == 2  # the next round: at 69 s
        assert [t.task_id for t in leases.step(_at(60)).overdue] == [1]
        assert not leases.heartbeat(quiet, _at(61))  # its lease is given up
        decided = leases.step(_at(69))
        assert decided.overdue == ()  # reported once
        assert [t.task_id for t in decided.extend] == [2]  # the overdue one is extended no more
        assert [t.task_id for t in leases.step(_at(110)).overdue] == [2]
    assert len(leases) == 0


def test_a_new_claim_of_the_same_task_is_another_attempt() -> None:
    leases = ActivityLeases(SHORT)
    old, new = _task(1, timedelta(seconds=60), version=1), _task(1, timedelta(seconds=60), version=2)
    with leases.running(old, _at(0)):
        assert [t.task_id for t in leases.step(_at(60)).overdue] == [1]
        with leases.running(new, _at(70)):
            assert leases.heartbeat(new, _at(71))  # not the overdue one
            assert not leases.heartbeat(old, _at(71))
            assert [t.lease.version for t in leases.step(_at(81)).extend] == [2]
