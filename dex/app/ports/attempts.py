"""What a store keeps of an activity step's attempts besides its task: the attempts that failed
and were retried, and those lost to a crash (re-exported by :mod:`dex.app.ports.store`).

Retried attempts are not history (a retry is a new visibility of the same task), so without
this a step that failed four times and then succeeded looks like one attempt. Nothing here is
written for an attempt that succeeds: a failed attempt is already a write (the retry that
reschedules its task), and a lost one is found by a claim that is a write too (the claim of a
task whose lease expired); each keeps the step's counts and its last
:data:`MAX_RECENT_ATTEMPTS` failures, bounded, next to it.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from dex.domain import events as ev
from dex.domain.values import FailureInfo

MAX_RECENT_ATTEMPTS = 5  # the failures kept per step, newest first

FAILED = "failed"  # the attempt's code raised (or ran past its lock_timeout) and it was retried
LOST = "lost"  # the attempt started and never reported: its lease expired (its worker died or hung)
ATTEMPT_KINDS = (FAILED, LOST)

# the failure a lost attempt is shown with: nothing of it was reported, so nothing else is known
LEASE_EXPIRED = "LeaseExpiredError"


def lost_attempt(attempt: int, lease_until: datetime) -> FailureInfo:
    """The failure of attempt ``attempt``, lost when its lease expired at ``lease_until``."""
    return FailureInfo(
        type=LEASE_EXPIRED,
        message=f"attempt {attempt} started but never reported: its lease expired at "
        f"{lease_until.isoformat(timespec='milliseconds')} (its worker died or hung)",
    )


@attrs.frozen(kw_only=True)
class FailedAttempt:
    """One attempt that did not succeed: its number, when it ended (a lost attempt: when its
    lease expired), ``kind`` (:data:`FAILED` or :data:`LOST`) and its failure."""

    attempt: int
    at: datetime
    kind: str
    failure: FailureInfo


@attrs.frozen(kw_only=True)
class PendingAttempt:
    """A step's task while it exists (until the step's outcome is written): the attempt it is
    at, ``state`` ("waiting": for its first attempt or a retry, from ``visible_from``;
    "queued": claimable; "running": claimed, its lease until ``lease_until``)."""

    attempt: int
    state: str
    visible_from: datetime
    lease_until: datetime | None = None


@attrs.frozen(kw_only=True)
class StepAttempts:
    """What a store knows of one activity step's attempts (the step is the run's
    ``ActivityTaskCreated`` at ``created_seq``), for a step with a task or a failed attempt.

    ``failed`` and ``lost`` count every retried failure and lost attempt, ``recent`` holds the
    newest of them (at most :data:`MAX_RECENT_ATTEMPTS`), and ``next_attempt`` is the number of
    the attempt after the last of them (1 when none: the first attempt). A step's final
    failure is in its history (``ActivityTaskFailed``), not here. ``pending`` is its task, None
    once its outcome is written."""

    created_seq: int
    failed: int = 0
    lost: int = 0
    next_attempt: int = 1
    recent: tuple[FailedAttempt, ...] = ()
    pending: PendingAttempt | None = None


def recorded(recent: tuple[FailedAttempt, ...], attempt: FailedAttempt) -> tuple[FailedAttempt, ...]:
    """``recent`` with ``attempt`` in front, bounded to :data:`MAX_RECENT_ATTEMPTS`."""
    return (attempt, *recent)[:MAX_RECENT_ATTEMPTS]


@attrs.frozen(kw_only=True)
class StepEndings:
    """The outcomes (``ActivityTaskCompleted``, ``ActivityTaskFailed``) of some activity steps
    found in a bounded stretch of a run's history (``Store.step_endings``), oldest first.

    ``complete`` says whether what was not found does not exist: every step asked about was
    found, or the stretch read reached the end of the history. When False, a step not found may
    have ended further on, beyond what was read."""

    events: tuple[ev.HistoryEvent, ...] = ()
    complete: bool = True
