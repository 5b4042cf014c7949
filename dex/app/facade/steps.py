"""The read model of a run's activity steps and their attempts (``Engine.activity_steps``).

A run's history says when each activity step was scheduled and how it ended, but a retried
attempt is not history: a step that failed four times and then succeeded reads like one
attempt, and a step still retrying like one that has not begun. The store keeps the rest
(:mod:`dex.app.ports.attempts`): the failed and lost attempts, and the step's task while it
exists. :func:`activity_steps` puts the two together, a pure function, so the command line, the
dashboard and the JSON API (which read the store directly) show what ``Engine.activity_steps``
returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from dex.app.ports.attempts import FAILED, LEASE_EXPIRED, MAX_RECENT_ATTEMPTS, FailedAttempt, StepAttempts
from dex.domain import events as ev

# a step's status: waiting for its first attempt, an attempt under way, waiting for a retry
# (``next_retry_at``), ended by a result or by a failure, or left when its run ended before it
SCHEDULED, RUNNING, RETRYING, COMPLETED, FAILED_STEP, ABANDONED = (
    "scheduled",
    "running",
    "retrying",
    "completed",
    "failed",
    "abandoned",
)
STEP_STATUSES = (SCHEDULED, RUNNING, RETRYING, COMPLETED, FAILED_STEP, ABANDONED)


@attrs.frozen(kw_only=True)
class ActivityStep:
    """One activity step of a run (its ``ActivityTaskCreated`` is event ``seq``) and its attempts.

    ``attempts`` counts the attempts begun (the one under way included); of those, ``failed``
    failed (its final failure included) and ``lost`` were lost to a crash: begun and never
    reported, their lease expired. ``recent`` holds the newest failed and lost attempts, newest
    first, at most :data:`~dex.app.ports.attempts.MAX_RECENT_ATTEMPTS` (a failure of a first
    attempt run inside its workflow task by an older engine may be counted without being
    there). ``next_retry_at`` is when the next attempt may begin while the step is
    ``retrying``; ``lease_expires_at``, while it is ``running``, when the attempt's lease runs
    out (a time past means its worker stopped reporting: the attempt is counted lost when
    another worker takes the step over)."""

    seq: int
    name: str
    status: str
    attempts: int
    failed: int
    lost: int
    recent: tuple[FailedAttempt, ...]
    scheduled_at: datetime
    ended_at: datetime | None = None
    next_retry_at: datetime | None = None
    lease_expires_at: datetime | None = None


def activity_steps(history: Sequence[ev.HistoryEvent], kept: Sequence[StepAttempts]) -> list[ActivityStep]:
    """Each activity step of ``history`` (oldest first), with what the store ``kept`` of its
    attempts (``Store.step_attempts``); what the store keeps of steps no longer in the history
    (a generation before ``continue_as_new``) is left out."""
    by_seq = {step.created_seq: step for step in kept}
    created: dict[int, tuple[str, datetime]] = {}
    outcomes: dict[int, tuple[ev.HistoryEvent, ev.ActivityTaskCompleted | ev.ActivityTaskFailed]] = {}
    ended = False
    for item in history:
        event = item.event
        if isinstance(event, ev.ActivityTaskCreated):
            created[item.sequence_number] = (event.name, item.timestamp)
        elif isinstance(event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)):
            outcomes[event.created_seq] = (item, event)
        elif isinstance(event, ev.RunCompleted):
            ended = True
    return [
        _step(seq, name, at, by_seq.get(seq, StepAttempts(created_seq=seq)), outcomes.get(seq), ended)
        for seq, (name, at) in sorted(created.items())
    ]


def _step(
    seq: int,
    name: str,
    scheduled_at: datetime,
    kept: StepAttempts,
    outcome: tuple[ev.HistoryEvent, ev.ActivityTaskCompleted | ev.ActivityTaskFailed] | None,
    run_ended: bool,
) -> ActivityStep:
    recent, ended_at, final = kept.recent, None, 0  # final: 1 when the history's failure ends it
    next_retry_at = lease_expires_at = None
    pending = kept.pending
    if outcome is not None:
        item, event = outcome
        ended_at = item.timestamp
        attempts = kept.next_attempt
        if isinstance(event, ev.ActivityTaskCompleted):
            status, unsuccessful = COMPLETED, attempts - 1
        elif event.failure.type == LEASE_EXPIRED and recent and recent[0].failure.type == LEASE_EXPIRED:
            # its last attempt was lost, and the claim that found it had no attempt left to
            # begin: that claim's failure ends the step, the lost attempt is its last
            status, attempts = FAILED_STEP, max(attempts - 1, 1)
            unsuccessful = attempts
        else:
            status, unsuccessful, final = FAILED_STEP, attempts, 1
            last = FailedAttempt(attempt=attempts, at=item.timestamp, kind=FAILED, failure=event.failure)
            recent = (last, *recent)[:MAX_RECENT_ATTEMPTS]
    elif pending is not None and pending.state == "running":
        status, attempts = RUNNING, pending.attempt
        unsuccessful, lease_expires_at = attempts - 1, pending.lease_until
    elif pending is not None:  # waiting, or claimable: the attempt it is at has not begun
        attempts = unsuccessful = pending.attempt - 1
        status = RETRYING if attempts > 0 else SCHEDULED
        next_retry_at = pending.visible_from if attempts > 0 else None
    else:  # no task: the run ended before the step did, or its task is not written yet
        attempts = unsuccessful = kept.next_attempt - 1
        status = ABANDONED if run_ended else SCHEDULED
    # the counts kept, or what the attempt numbers say if more (a failure not kept: see above)
    failed = max(unsuccessful - kept.lost, kept.failed + final, 0)
    return ActivityStep(
        seq=seq,
        name=name,
        status=status,
        attempts=attempts,
        failed=failed,
        lost=kept.lost,
        recent=recent,
        scheduled_at=scheduled_at,
        ended_at=ended_at,
        next_retry_at=next_retry_at,
        lease_expires_at=lease_expires_at,
    )
