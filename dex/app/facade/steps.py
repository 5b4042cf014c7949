"""The read model of a run's activity steps and their attempts (``Engine.activity_steps``).

A run's history says when each activity step was scheduled and how it ended, but a retried
attempt is not history: a step that failed four times and then succeeded reads like one
attempt, and a step still retrying like one that has not begun. The store keeps the rest
(:mod:`dex.app.ports.attempts`): the failed and lost attempts, and the step's task while it
exists. :func:`activity_steps` puts the two together, a pure function, so the command line, the
dashboard and the JSON API (which read the store directly) show what ``Engine.activity_steps``
returns.

A run page or a page of the API shows the steps scheduled in a stretch of a long history:
:func:`steps_in` builds them from that stretch, the store's attempts of those steps only, and
their outcomes found in at most :data:`MAX_ENDINGS_READ` events after it
(``Store.step_endings``). A step whose outcome lies further on is shown ``unknown``, not as a
step that never ended. ``Engine.activity_steps`` reads the whole history: a deliberate call
about one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from dex.app.ports.attempts import FAILED, LEASE_EXPIRED, MAX_RECENT_ATTEMPTS, FailedAttempt, StepAttempts
from dex.app.ports.store import AttemptReads
from dex.domain import events as ev

# a step's status: waiting for its first attempt, an attempt under way, waiting for a retry
# (``next_retry_at``), ended by a result or by a failure, or left when its run ended before it;
# unknown: no task is left, and its outcome, if it has one, lies beyond the stretch of history
# read (a page's steps: :func:`steps_in`)
SCHEDULED, RUNNING, RETRYING, COMPLETED, FAILED_STEP, ABANDONED, UNKNOWN = (
    "scheduled",
    "running",
    "retrying",
    "completed",
    "failed",
    "abandoned",
    "unknown",
)
STEP_STATUSES = (SCHEDULED, RUNNING, RETRYING, COMPLETED, FAILED_STEP, ABANDONED, UNKNOWN)

# events read after a stretch of history to find where its steps ended: a step that ends
# further on is shown unknown (a run that schedules thousands of steps at once and awaits them
# all ends the first far later; reading up to there on every view is what paging avoids)
MAX_ENDINGS_READ = 10_000
_OUTCOMES = (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)


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


def activity_steps(
    history: Sequence[ev.HistoryEvent],
    kept: Sequence[StepAttempts],
    *,
    run_ended: bool = False,
    outcomes_read: bool = True,
) -> list[ActivityStep]:
    """Each activity step of ``history`` (oldest first), with what the store ``kept`` of its
    attempts (``Store.step_attempts``); what the store keeps of steps no longer in the history
    (a generation before ``continue_as_new``) is left out.

    ``history`` may be a stretch of the run's history and the outcomes found after it
    (:func:`steps_in`): then ``run_ended`` says whether the run has ended (else its
    ``RunCompleted`` in ``history`` does), and ``outcomes_read`` False that an outcome not in
    ``history`` may lie beyond what was read (a step with no task then shows ``unknown``)."""
    by_seq = {step.created_seq: step for step in kept}
    created: dict[int, tuple[str, datetime]] = {}
    outcomes: dict[int, tuple[ev.HistoryEvent, ev.ActivityTaskCompleted | ev.ActivityTaskFailed]] = {}
    ended = run_ended
    for item in history:
        event = item.event
        if isinstance(event, ev.ActivityTaskCreated):
            created[item.sequence_number] = (event.name, item.timestamp)
        elif isinstance(event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)):
            outcomes[event.created_seq] = (item, event)
        elif isinstance(event, ev.RunCompleted):
            ended = True
    return [
        _step(seq, name, at, by_seq.get(seq, StepAttempts(created_seq=seq)), outcomes.get(seq), ended, outcomes_read)
        for seq, (name, at) in sorted(created.items())
    ]


def steps_in(
    store: AttemptReads,
    run_id: str,
    stretch: Sequence[ev.HistoryEvent],
    run_ended: bool,
    most: int = MAX_ENDINGS_READ,
    following: Sequence[ev.HistoryEvent] = (),
) -> list[ActivityStep]:
    """The activity steps scheduled in ``stretch``, consecutive events of the run's history
    (a page), read in bounded reads: the store's attempts of those steps, then the outcomes not
    in ``stretch`` (nor in ``following``, the events after it that the caller has read already)
    among the ``most`` events after those, a short read first (a step's outcome usually
    follows it closely). The attempts are read before the outcomes, as
    ``Engine.activity_steps`` reads them: a step that ends between the two reads shows ended."""
    created = [item.sequence_number for item in stretch if isinstance(item.event, ev.ActivityTaskCreated)]
    if not created:
        return []
    kept = store.step_attempts(run_id, created)
    wanted = set(created)
    found = [item for item in (*stretch, *following) if _outcome_of(item) in wanted]
    tasks = {step.created_seq for step in kept if step.pending is not None}
    # a step with a task has no outcome yet: only the others are looked for
    sought = wanted - tasks - {_outcome_of(item) for item in found}
    after, read, complete = (following or stretch)[-1].sequence_number, 0, not sought
    limit = min(1_000, most)
    while sought and read < most:
        endings = store.step_endings(run_id, sought, after + read, limit)
        found.extend(endings.events)
        sought -= {_outcome_of(item) for item in endings.events}
        read += limit
        complete = endings.complete
        if complete:
            break
        limit = most - read
    steps = [item for item in stretch if isinstance(item.event, ev.ActivityTaskCreated)]
    return activity_steps([*steps, *found], kept, run_ended=run_ended, outcomes_read=complete)


def _outcome_of(item: ev.HistoryEvent) -> int | None:
    """The step an event is the outcome of (its ``created_seq``), or None."""
    return item.event.created_seq if isinstance(item.event, _OUTCOMES) else None


def _step(
    seq: int,
    name: str,
    scheduled_at: datetime,
    kept: StepAttempts,
    outcome: tuple[ev.HistoryEvent, ev.ActivityTaskCompleted | ev.ActivityTaskFailed] | None,
    run_ended: bool,
    outcomes_read: bool = True,
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
    else:  # no task: the run ended before the step did, or its task is not written yet, or
        # (a stretch of the history read) its outcome lies beyond what was read
        attempts = unsuccessful = kept.next_attempt - 1
        status = (ABANDONED if run_ended else SCHEDULED) if outcomes_read else UNKNOWN
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
