"""The register of running attempts tells an attempt of its cancellation (docs/reference/contract.md §13) once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dex.app.activities.leases import CHECK_RUNS_EVERY, ActivityLeases
from dex.app.ports.store import ActivityTask, Lease
from dex.domain.retry import RetryPolicy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _task(task_id: int = 1, version: int = 1) -> ActivityTask:
    return ActivityTask(
        task_id=task_id,
        run_id=f"r{task_id}",
        created_seq=2,
        name="a",
        input=(),
        queue="default",
        priority=0,
        attempt=1,
        retry_policy=RetryPolicy(),
        lock_timeout=timedelta(minutes=5),
        lease=Lease(owner="me", until=NOW + timedelta(seconds=30), version=version),
    )


def test_cancel_marks_the_attempt_and_stops_it_once() -> None:
    leases = ActivityLeases(timedelta(seconds=30))
    stops: list[str] = []
    task = _task()
    with leases.running(task, NOW):
        leases.on_cancel(task, lambda: stops.append("stopped"))
        assert not leases.cancelled(task)
        assert leases.cancel(task) is True
        assert leases.cancel(task) is False  # told once
        assert leases.cancelled(task) and stops == ["stopped"]
        assert not leases.cancelled(_task(version=2))  # a later claim of the task is another attempt
    assert not leases.cancelled(task) and leases.cancel(task) is False  # ended: nothing to tell


def test_a_stop_registered_after_the_cancel_runs_at_once() -> None:
    leases = ActivityLeases(timedelta(seconds=30))
    task, stops = _task(), []
    with leases.running(task, NOW):
        leases.cancel(task)
        leases.on_cancel(task, lambda: stops.append(1))
    assert stops == [1]


def test_runs_are_checked_once_per_interval_and_cancelled_ones_no_more() -> None:
    leases = ActivityLeases(timedelta(seconds=30))
    first, second = _task(1), _task(2)
    with leases.running(first, NOW), leases.running(second, NOW):
        assert set(leases.due_checks(NOW)) == {first, second}
        assert leases.due_checks(NOW + CHECK_RUNS_EVERY / 2) == ()
        leases.cancel(first)
        assert leases.due_checks(NOW + CHECK_RUNS_EVERY) == (second,)
