"""Transaction steps run inside their workflow tasks, a group of them in one transaction.

:meth:`~dex.app.ports.transactions.TransactionSteps.checkpoint_steps` on PostgreSQL. One
transaction at READ COMMITTED serves a whole group (the workflow round's tasks that reached a
transaction step), so a step costs its own statements, not a transaction, a task claim, a
dispatch and a workflow task of its own:

1. the runs are locked ``FOR NO KEY UPDATE`` in run id order (as a completion locks them), then
   the workflow tasks still held by their leases ``FOR UPDATE`` in (queue, task_id) order: while
   the group runs, no claim can take them over (claims skip locked rows), and a task taken over
   before (another lease version) or a history that moved on (``expected_last_seq``) puts its
   step out of the group, with nothing run;
2. each step's function runs in that transaction, one after the other. One that fails (raises,
   or leaves the transaction aborted) rolls the whole group back, and the group runs again
   without it, its failure answered apart: the other steps' functions then run a second time,
   and only the run that commits counts — as when PostgreSQL makes a step retry. (A savepoint
   per step would keep the others' work, at two more round trips for every step, failing or
   not: measured, more than the step's own statement.)
3. for the steps that succeeded, their tasks' results so far are written as
   :func:`~dex.adapters.postgres.completion.complete_workflow_tasks` writes a result (the same
   round of statements) but the tasks stay, and each step's outcome goes to its run's inbox.

After the commit a run stands exactly as if its step had run as a task of its own and its
completion had arrived: a worker that takes the workflow task over replays the history and
reads the outcome from the inbox. Lock order stays the completions' (runs, then task rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq

from dex.adapters.postgres import arrays
from dex.adapters.postgres.completion import LockedRun, WriteRound, claims
from dex.adapters.postgres.schema import Statements
from dex.adapters.postgres.transactions import CURRENT_TRANSACTION, ended_by_the_function, failed_transaction
from dex.app.ports.transactions import Checkpointed, CheckpointOutcome, StepCheckpoint, StepFailed
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.serialization.history import encode_message


def in_transaction(
    conn: psycopg.Connection, q: Statements, items: Sequence[StepCheckpoint], now: datetime
) -> list[CheckpointOutcome]:
    """The group in one transaction of a steps' connection (:mod:`.step_sessions`) at READ
    COMMITTED (set for its duration, as :func:`~dex.adapters.postgres.transactions.complete_sync`
    sets a step's)."""
    conn.autocommit, conn.isolation_level = False, psycopg.IsolationLevel.READ_COMMITTED
    failed: dict[int, BaseException] = {}  # the steps whose function failed, by index: left out
    try:
        while True:  # at most once more than there are steps: each pass that fails leaves one out
            try:
                with conn.transaction():
                    return checkpoint_steps(conn, q, items, now, failed)
            except _Again:
                continue
    finally:
        if not conn.closed:
            conn.rollback()  # nothing is open after the block; this only makes sure
            conn.autocommit, conn.isolation_level = True, None


class TransactionEnded(RuntimeError):
    """A step's function ended the group's transaction and went on in a new one."""


class _Again(Exception):
    """A step's function failed: the group's transaction rolls back and runs again without it."""


def checkpoint_steps(
    conn: psycopg.Connection,
    q: Statements,
    items: Sequence[StepCheckpoint],
    now: datetime,
    failed: dict[int, BaseException],
) -> list[CheckpointOutcome]:
    """The group in the caller's open transaction; a step's function that fails is added to
    ``failed`` and ``_Again`` raised (the caller rolls back and calls again)."""
    with conn.pipeline():  # the two locks (and the transaction's BEGIN) in one exchange
        locked_runs, locked_tasks = _lock_runs(conn, q, items), _lock_tasks(conn, q, items)
        began = conn.execute(CURRENT_TRANSACTION)
        runs = {run_id: LockedRun(RunStatus(status), last_seq) for run_id, status, last_seq in locked_runs.fetchall()}
        held = {(queue, task_id) for queue, task_id in locked_tasks.fetchall()}
    transaction = began.fetchone()
    outcomes: list[CheckpointOutcome | ev.ActivityTaskCompleted] = []
    written: list[tuple[StepCheckpoint, ev.ActivityTaskCompleted]] = []
    for index, item in enumerate(items):
        run = runs.get(item.task.run_id)
        if (
            (item.task.queue, item.task.task_id) not in held
            or run is None
            or run.last_seq != item.result.expected_last_seq
        ):
            outcomes.append(None)
            continue
        if index in failed:
            outcomes.append(failed[index])
            continue
        try:
            result = item.work(conn)
            aborted = failed_transaction(conn.info.transaction_status)
            if aborted is not None:
                raise aborted
            if conn.info.transaction_status == pq.TransactionStatus.IDLE:  # COMMIT or ROLLBACK as SQL
                raise ended_by_the_function(item.step.name)
        except StepFailed as failed_step:
            failed[index] = failed_step.cause
            raise _Again from None
        message = ev.ActivityTaskCompleted(created_seq=item.step.created_seq, result=result)
        written.append((item, message))
        outcomes.append(message)  # replaced by its Checkpointed below
    if not written:  # (then no outcome is a message)
        return [outcome for outcome in outcomes if not isinstance(outcome, ev.ActivityTaskCompleted)]
    with conn.pipeline():  # the writes go out together: only the inbox ids are waited for
        current = conn.execute(CURRENT_TRANSACTION)
        writes = WriteRound(conn, q, runs, now)
        for item, _message in written:
            writes.add(item.task.run_id, runs[item.task.run_id], item.result)
        writes.flush()
        ids = _insert_outcomes(conn, q, written, now)
    if current.fetchone() != transaction:
        # a function ended the group's transaction and went on in another: the group fails, and
        # its steps go on as tasks of their own, where the one that did it fails (transactions.py)
        raise TransactionEnded("a step of the group ended its transaction (COMMIT or ROLLBACK sent as SQL)")
    return [
        Checkpointed(message_id=ids[item.task.run_id], message=outcome, last_seq=runs[item.task.run_id].last_seq)
        if isinstance(outcome, ev.ActivityTaskCompleted)
        else outcome
        for item, outcome in zip(items, outcomes, strict=True)
    ]


def _lock_runs(conn: psycopg.Connection, q: Statements, items: Sequence[StepCheckpoint]) -> psycopg.Cursor[Any]:
    targets = {item.task.run_id for item in items}
    targets.update(message.run_id for item in items for message in item.result.messages)
    return conn.execute(
        q(
            "SELECT run_id, status, last_seq FROM {s}.runs WHERE run_id = ANY(%b::text[])"
            " ORDER BY run_id FOR NO KEY UPDATE"
        ),
        [arrays.texts(sorted(targets))],
    )


def _lock_tasks(conn: psycopg.Connection, q: Statements, items: Sequence[StepCheckpoint]) -> psycopg.Cursor[Any]:
    tasks = sorted((item.task for item in items), key=lambda t: (t.queue, t.task_id))
    return conn.execute(
        q(
            "SELECT t.queue, t.task_id FROM {s}.workflow_tasks t"
            " JOIN unnest(%b::text[], %b::bigint[], %b::text[], %b::integer[]) AS l(queue, task_id, owner, version)"
            "  ON t.queue = l.queue AND t.task_id = l.task_id"
            " WHERE t.locked_by = l.owner AND t.lock_version = l.version"
            " ORDER BY t.queue, t.task_id FOR UPDATE OF t"
        ),
        claims(tasks),
    )


def _insert_outcomes(
    conn: psycopg.Connection,
    q: Statements,
    written: Sequence[tuple[StepCheckpoint, ev.ActivityTaskCompleted]],
    now: datetime,
) -> dict[str, int]:
    """The steps' outcomes into their runs' inboxes; their message ids by run (a run has one
    workflow task, so one step in a group)."""
    rows = conn.execute(
        q(
            "INSERT INTO {s}.inbox (run_id, kind, message, visible_from)"
            " SELECT m.run_id, %s, m.message, %s FROM unnest(%b::text[], %b::bytea[]) AS m(run_id, message)"
            " RETURNING run_id, message_id"
        ),
        [
            ev.ActivityTaskCompleted.__name__,  # the kind column, as rows.inbox_row writes it
            now,
            arrays.texts([item.task.run_id for item, _ in written]),
            arrays.byteas([encode_message(message) for _, message in written]),
        ],
    ).fetchall()
    return {run_id: message_id for run_id, message_id in rows}
