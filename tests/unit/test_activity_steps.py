"""``activity_steps``: a run's history and the store's kept attempts made into each activity
step's attempts, without a store (the contract suites drive it through both adapters)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dex.app.facade.steps import activity_steps
from dex.app.ports.attempts import FAILED, MAX_RECENT_ATTEMPTS
from dex.app.ports.store import FailedAttempt, PendingAttempt, StepAttempts
from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo

T0 = datetime(2025, 5, 1, 9, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _created(seq: int, name: str = "charge") -> ev.HistoryEvent:
    event = ev.ActivityTaskCreated(
        name=name, input=(), queue="default", priority=0, retry_policy=RetryPolicy(), lock_timeout=timedelta(minutes=5)
    )
    return ev.HistoryEvent(sequence_number=seq, timestamp=_at(seq), event=event)


def _failure(n: int) -> FailedAttempt:
    return FailedAttempt(attempt=n, at=_at(n), kind=FAILED, failure=FailureInfo(type="E", message=f"failure {n}"))


def test_a_failed_step_shows_its_final_failure_first_and_the_list_stays_bounded() -> None:
    recent = tuple(_failure(n) for n in range(MAX_RECENT_ATTEMPTS, 0, -1))
    kept = StepAttempts(created_seq=4, failed=MAX_RECENT_ATTEMPTS, next_attempt=MAX_RECENT_ATTEMPTS + 1, recent=recent)
    final = ev.ActivityTaskFailed(created_seq=4, failure=FailureInfo(type="E", message="the last"))
    history = [_created(4), ev.HistoryEvent(sequence_number=9, timestamp=_at(9), event=final)]
    (step,) = activity_steps(history, [kept])
    assert (step.status, step.attempts, step.failed, step.ended_at) == ("failed", 6, 6, _at(9))
    assert len(step.recent) == MAX_RECENT_ATTEMPTS
    assert [a.attempt for a in step.recent] == [6, 5, 4, 3, 2]
    assert step.recent[0].failure.message == "the last"


def test_pending_steps_say_where_they_stand() -> None:
    waiting = StepAttempts(created_seq=4, pending=PendingAttempt(attempt=1, state="waiting", visible_from=_at(4)))
    queued = StepAttempts(created_seq=5, pending=PendingAttempt(attempt=1, state="queued", visible_from=_at(5)))
    retry = PendingAttempt(attempt=3, state="waiting", visible_from=_at(60))
    retrying = StepAttempts(created_seq=6, failed=1, next_attempt=3, recent=(_failure(2),), pending=retry)
    lease = PendingAttempt(attempt=2, state="running", visible_from=_at(7), lease_until=_at(37))
    running = StepAttempts(created_seq=7, failed=1, next_attempt=2, recent=(_failure(1),), pending=lease)
    history = [_created(seq) for seq in (4, 5, 6, 7, 8)]
    steps = activity_steps(history, [waiting, queued, retrying, running])
    shown = [(s.seq, s.status, s.attempts, s.failed, s.next_retry_at, s.lease_expires_at) for s in steps]
    assert shown == [
        (4, "scheduled", 0, 0, None, None),
        (5, "scheduled", 0, 0, None, None),
        # attempt 1 failed inside its workflow task by an engine that kept no failure: counted all the same
        (6, "retrying", 2, 2, _at(60), None),
        (7, "running", 2, 1, None, _at(37)),
        (8, "scheduled", 0, 0, None, None),  # its task is not written yet
    ]


def test_a_step_left_when_its_run_ended_is_abandoned_and_old_generations_are_left_out() -> None:
    kept = [StepAttempts(created_seq=4, failed=1, next_attempt=2, recent=(_failure(1),)), StepAttempts(created_seq=2)]
    ended = ev.RunCompleted(status=RunStatus.CANCELLED)
    history = [_created(4), ev.HistoryEvent(sequence_number=9, timestamp=_at(9), event=ended)]
    (step,) = activity_steps(history, kept)  # seq 2 is not in this history (a generation before)
    assert (step.seq, step.status, step.attempts, step.failed) == (4, "abandoned", 1, 1)
