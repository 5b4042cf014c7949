"""Completions that hand the next step over at once: what a batch makes due is dispatched in
its own transaction, and the next tasks claimed there too ("complete, then claim").

A workflow task's result makes activity tasks (and messages to runs) due; an activity's
outcome makes its run's workflow task due. Instead of leaving that to the scheduler's next
round and a worker's next poll, the completion's transaction schedules the work under the
scheduler's rules (:func:`dispatch_now`) and claims it for this engine (``Claim``).

Each is one pipelined transaction: what is sent before the first answer is read goes out
together. A workflow completion reads twice (the run locks with the lease-checking delete;
then the claim's rows, which come with the commit: the writes and the dispatch read nothing);
an activity completion with a retry in its batch reads its locks, then its claim and its
load. (A batch of finished activity attempts does not come here: one call of a function,
:mod:`.activity_outcomes`.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import psycopg

from dex.adapters.postgres import activity_tasks, completion, workflow_tasks
from dex.adapters.postgres.schema import LOCK_SCHEDULE_ACTIVITIES, LOCK_SCHEDULE_WORKFLOWS, Statements
from dex.app.ports.store import ActivityOutcome, ActivityTask, Claim, Loaded, WorkflowTask
from dex.domain.task import WorkflowTaskResult

DISPATCH_BATCH = 256

# A dispatch's statement, sent only after the lock was tried: (conn, q, now, limit, gate)
Dispatch = Callable[[psycopg.Connection, Statements, datetime, int, str], None]


def dispatch_now(conn: psycopg.Connection, q: Statements, dispatch: Dispatch, lock: int, now: datetime) -> None:
    """Run a scheduler inside a completion's transaction, if no scheduler is running now.

    A completion that makes work due (activity tasks, messages to runs) schedules it at
    once instead of leaving it to the leader's next round: one transaction and one thread
    hand-off fewer per step. The scheduler's own rules (capacity, pause, concurrency keys)
    apply unchanged, under the same advisory lock; the lock is only *tried*, so a
    completion never waits for a scheduler (the leader's round picks the work up then), and
    the scheduler's statements skip locked rows, so no lock order is broken.

    Neither statement's answer is read, so in a pipeline the dispatch costs no round trip:
    the try's answer is kept in a setting of the transaction (``dex.dispatch_<lock>``, gone
    at its end), which the dispatch's statement checks. That statement starts after the lock
    was taken, so its snapshot holds what the lock's previous holder committed, as when the
    answer was read first.
    """
    gate = f"dex.dispatch_{lock}"
    conn.execute(
        "SELECT set_config(%s, pg_try_advisory_xact_lock(%s, hashtext(%s))::text, true)", [gate, lock, q.schema]
    )
    dispatch(conn, q, now, DISPATCH_BATCH, gate)


def of_runs(run_ids: list[str]) -> Dispatch:
    """A completion's workflow-task dispatch: the scheduler's choice among the runs it told."""
    return lambda conn, q, now, _limit, gate: workflow_tasks.dispatch_workflow_tasks_of(conn, q, now, run_ids, gate)


@contextmanager
def begin(conn: psycopg.Connection, pipeline: bool) -> Iterator[None]:
    """A transaction on ``conn``; with ``pipeline``, in psycopg's pipeline mode, which ends
    with the transaction: the answers not yet read arrive with its commit.

    In a pipeline, ``BEGIN`` and ``COMMIT`` are sent as statements of the pipeline: psycopg's
    ``transaction()`` inside a pipeline waits for the server when it begins and again around
    its commit, which made a block that reads once five exchanges instead of two (and, under
    load, each exchange is one more wait for the GIL when the answer comes back). Whatever
    ends the block early rolls the transaction back; a connection that cannot be rolled back
    is closed, so the pool replaces it."""
    if not pipeline:
        with conn.transaction():
            yield
        return
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            # a completion's statements find rows by key (unnest of ids joined on primary
            # keys), so a cached generic plan is as good as a fresh one and saves planning
            # each of them every time; see session_settings
            conn.execute("SET LOCAL plan_cache_mode = auto")
            yield
            conn.execute("COMMIT")
    except BaseException:
        _roll_back(conn)
        raise


def _roll_back(conn: psycopg.Connection) -> None:
    """End a failed pipelined transaction; close the connection if even that fails."""
    try:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
    except BaseException:  # noqa: BLE001 - the connection is unusable: the pool discards a closed one
        conn.close()


def complete_workflow_tasks_then_claim(
    conn: psycopg.Connection,
    q: Statements,
    results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]],
    now: datetime,
    claim: Claim | None,
) -> tuple[list[bool], list[ActivityTask]]:
    """Write a batch of workflow task results; dispatch what they made due; with ``claim``,
    claim activity tasks. The claim's rows are read after the commit, which they come with."""
    with begin(conn, pipeline=True):
        applied = completion.complete_workflow_tasks(conn, q, results, now)
        written = [result for (_task, result), ok in zip(results, applied, strict=True) if ok]
        made_activities = any(result.activity_tasks for result in written)
        if made_activities:
            dispatch_now(conn, q, activity_tasks.dispatch_activity_tasks, LOCK_SCHEDULE_ACTIVITIES, now)
        told = _told(written)
        if told:
            dispatch_now(conn, q, of_runs(told), LOCK_SCHEDULE_WORKFLOWS, now)
        claim_sent = None
        if claim is not None and made_activities:
            claim_sent = activity_tasks.send_activity_claim(
                conn, q, claim.names, claim.owner, now, claim.lease, claim.limit
            )
    return applied, activity_tasks.claimed_activity_tasks(claim_sent)


def _told(written: Sequence[WorkflowTaskResult]) -> list[str]:
    """The runs a batch's written results sent messages to (or started)."""
    return [m.run_id for r in written for m in r.messages] + [c.run_id for r in written for c in r.child_runs]


def complete_activity_tasks_then_claim(
    conn: psycopg.Connection,
    q: Statements,
    outcomes: Sequence[ActivityOutcome],
    now: datetime,
    claim: Claim | None,
) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
    """Write a batch of activity outcomes (retries among them); dispatch the workflow tasks of
    the runs told; with ``claim``, claim workflow tasks and load their input."""
    with begin(conn, pipeline=True):
        applied = activity_tasks.complete_activity_tasks(conn, q, outcomes, now)
        told = [o.task.run_id for o, ok in zip(outcomes, applied, strict=True) if ok and o.retry_at is None]
        if told:
            dispatch_now(conn, q, of_runs(told), LOCK_SCHEDULE_WORKFLOWS, now)
        claimed: list[WorkflowTask] = []
        loaded: list[Loaded] = []
        if claim is not None and told:
            claimed = workflow_tasks.claim_workflow_tasks(
                conn, q, claim.names, claim.owner, now, claim.lease, claim.limit
            )
            if claim.after_seqs is not None and claimed:
                after = claim.after_seqs
                requests = [(task, after.get(task.run_id, 0)) for task in claimed]
                loaded = workflow_tasks.load_workflow_tasks(conn, q, requests, now)
        return applied, claimed, loaded
