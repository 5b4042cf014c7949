"""Activity steps' failed and lost attempts (:mod:`dex.app.ports.attempts`), in the table of
migration 10.

Nothing is written for an attempt that succeeds. A failed attempt's row is written by the
statement :func:`record_failures` makes, sent in the same transaction as the retry that
reschedules its task (:func:`.activity_tasks.completion_writes`); a lost attempt's by the claim
that takes its task over once its lease expired (:func:`.activity_tasks.send_activity_claim`,
with :data:`LOST_FROM_CLAIM`). Both write one row per step, its newest
:data:`~dex.app.ports.attempts.MAX_RECENT_ATTEMPTS` attempts in arrays, newest first. The task
row is locked first in both (the claim's ``FOR UPDATE``, the completion's lease check), so two
writes of one step's row never race, and the rows are written in the task rows' order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import Statements
from dex.app.ports.attempts import FAILED, LOST, MAX_RECENT_ATTEMPTS, lost_attempt
from dex.app.ports.store import ActivityOutcome, FailedAttempt, PendingAttempt, StepAttempts
from dex.domain.task import NewActivityTask
from dex.domain.values import FailureInfo
from dex.serialization.values import decode_failure, encode_failure

# the upsert of one attempt per row of SOURCE, a relation (run_id, created_seq, attempt, kind,
# at, failure): counts added, the newest attempts kept in front, the arrays cut to the bound
_UPSERT = (
    "INSERT INTO {s}.activity_attempts AS a"
    " (run_id, created_seq, failed, lost, next_attempt, attempts, kinds, at, failures)"
    " SELECT r.run_id, r.created_seq, (r.kind = 'failed')::int, (r.kind = 'lost')::int, r.attempt + 1,"
    "  ARRAY[r.attempt], ARRAY[r.kind], ARRAY[r.at], ARRAY[r.failure] FROM SOURCE"
    " ON CONFLICT (run_id, created_seq) DO UPDATE SET"
    "  failed = a.failed + excluded.failed, lost = a.lost + excluded.lost, next_attempt = excluded.next_attempt,"
    f"  attempts = (excluded.attempts || a.attempts)[1:{MAX_RECENT_ATTEMPTS}],"
    f"  kinds = (excluded.kinds || a.kinds)[1:{MAX_RECENT_ATTEMPTS}],"
    f"  at = (excluded.at || a.at)[1:{MAX_RECENT_ATTEMPTS}],"
    f"  failures = (excluded.failures || a.failures)[1:{MAX_RECENT_ATTEMPTS}]"
)
_FAILURES = _UPSERT.replace(
    "SOURCE",
    "unnest(%b::text[], %b::integer[], %b::integer[], %b::text[], %b::timestamptz[], %b::bytea[])"
    " AS r(run_id, created_seq, attempt, kind, at, failure)",
)
# the claim's CTE: each task it took over from an expired lease (``claimable``, read before the
# claim's update, so with the lost attempt's number and lease) is kept as a lost attempt
LOST_FROM_CLAIM = _UPSERT.replace(
    "SOURCE",
    "(SELECT c.run_id, c.created_seq, c.attempt, 'lost' AS kind, c.locked_until AS at, NULL::bytea AS failure"
    " FROM claimable c WHERE c.locked_by IS NOT NULL) AS r",
)

Statement = tuple[Any, list[Any]]


def record_failures(q: Statements, retries: Sequence[ActivityOutcome], now: datetime) -> Statement | None:
    """The statement that keeps the failed attempts among ``retries`` (applied retries, one per
    task): those that count, with a failure; None if there are none. A retry the machinery
    caused (``counts`` False) is the same attempt again, not a failed one."""
    failed = [(o.task.run_id, o.task.created_seq, o.task.attempt, o.failure) for o in retries if o.counts and o.failure]
    return _failures(q, failed, now)


def record_inline_failures(q: Statements, specs: Sequence[NewActivityTask], now: datetime) -> Statement | None:
    """The statement that keeps, for the new tasks that retry a first attempt run inside their
    workflow task, that attempt's failure; None for none (the usual case: nothing is sent)."""
    failed = [(s.run_id, s.created_seq, s.attempt - 1, s.failure) for s in specs if s.failure and s.attempt > 1]
    return _failures(q, failed, now)


def _failures(
    q: Statements, failed: Sequence[tuple[str, int, int, FailureInfo | None]], now: datetime
) -> Statement | None:
    if not failed:
        return None
    return (
        q(_FAILURES),
        [
            [run_id for run_id, _seq, _attempt, _failure in failed],
            [seq for _run_id, seq, _attempt, _failure in failed],
            [attempt for _run_id, _seq, attempt, _failure in failed],
            [FAILED] * len(failed),
            [now] * len(failed),
            [encode_failure(failure) if failure is not None else None for _run_id, _seq, _attempt, failure in failed],
        ],
    )


def step_attempts(
    conn: psycopg.Connection, q: Statements, run_id: str, created_seqs: Collection[int] | None = None
) -> list[StepAttempts]:
    """The run's steps (or those of ``created_seqs``) with a task or a failed or lost attempt,
    by ``created_seq``: one statement, so the attempts kept and the tasks are read in one
    snapshot. The attempts are found on their primary key; the tasks on ``run_id`` (with the
    step numbers, a page's steps read only their rows)."""
    only = "" if created_seqs is None else " AND created_seq = ANY(%(seqs)b::integer[])"
    rows = conn.execute(
        q(
            "SELECT coalesce(a.created_seq, t.created_seq), a.failed, a.lost, a.next_attempt, a.attempts, a.kinds,"
            " a.at, a.failures, t.attempt, t.state, t.visible_from, t.locked_by, t.locked_until"
            " FROM (SELECT * FROM {s}.activity_attempts WHERE run_id = %(run)s" + only + ") a FULL JOIN"
            " (SELECT created_seq, attempt, state, visible_from, locked_by, locked_until FROM {s}.activity_tasks"
            "  WHERE run_id = %(run)s" + only + ") t ON a.created_seq = t.created_seq"
        ),
        {"run": run_id, "seqs": arrays.int4s(sorted({n for n in created_seqs or () if 0 < n < 2**31}))},
    ).fetchall()
    steps = []
    for seq, failed, lost, next_attempt, numbers, kinds, at, failures, attempt, state, visible, owner, until in rows:
        pending = None
        if attempt is not None:
            if state == "CREATED":
                pending = PendingAttempt(attempt=attempt, state="waiting", visible_from=visible)
            else:
                held = until if owner is not None else None
                state = "running" if held is not None else "queued"
                pending = PendingAttempt(attempt=attempt, state=state, visible_from=visible, lease_until=held)
        if failed is None:
            steps.append(StepAttempts(created_seq=seq, pending=pending))
            continue
        recent = tuple(
            _attempt(number, kind, moment, blob)
            for number, kind, moment, blob in zip(numbers, kinds, at, failures, strict=True)
        )
        steps.append(
            StepAttempts(
                created_seq=seq, failed=failed, lost=lost, next_attempt=next_attempt, recent=recent, pending=pending
            )
        )
    return sorted(steps, key=lambda step: step.created_seq)


def _attempt(number: int, kind: str, at: Any, blob: bytes | None) -> FailedAttempt:
    if kind == LOST or blob is None:
        return FailedAttempt(attempt=number, at=at, kind=LOST, failure=lost_attempt(number, at))
    try:
        failure = decode_failure(blob)
    except ValueError:  # one unreadable failure must not hide the step's others
        failure = FailureInfo(type="UnreadableFailure", message="this attempt's failure could not be read back")
    return FailedAttempt(attempt=number, at=at, kind=kind, failure=failure)
