"""Finished activity attempts written in one call of the schema's ``complete_activities``.

A batch of activity outcomes none of which is a retry (the ordinary case: each attempt ended
with a result or a final failure) is written by the function of migration 9, which does in
one statement, on an autocommit connection, what :func:`.activity_tasks.complete_activity_tasks`,
the completion's dispatch and the workflow claim with its load do in a pipelined transaction:
one round trip instead of six or seven, and statements the server plans once per session
instead of parsing and planning each of them on every write (measured in
docs/decisions/completion-round-trips.md). The locks, their order and the checks are the same (the migration's
docstring lists them); a batch that holds a retry takes the transaction's path, whose
statements the retry's attempt accounting lives in.

Every value goes as a parameter: the texts packed as binary arrays (:mod:`.arrays`), so a
NUL is refused by the server and a lone surrogate by the encoder, both as refused data
(:mod:`.refusals`), as on the other path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg

from dex.adapters.postgres import arrays, workflow_tasks
from dex.adapters.postgres.rows import inbox_row, workflow_task
from dex.adapters.postgres.schema import LOCK_SCHEDULE_WORKFLOWS, Statements
from dex.app.ports.store import ActivityOutcome, Claim, Loaded, WorkflowTask
from dex.domain.writes import INBOX_ORDER, WAKING_KINDS

# the function orders a load's messages by (visible_from, message_id), frozen in migration 9;
# if the domain's order ever changes, the function must be replaced by a new migration
assert INBOX_ORDER == ("visible_from", "message_id"), "complete_activities (migration 9) loads in the old order"

_CALL = (
    "SELECT out_part, out_ord, out_task, out_run, out_workflow, out_queue, out_priority, out_version,"
    " out_message, out_data FROM {s}.complete_activities("
    "%b::text[], %b::bigint[], %b::text[], %b::integer[], %b::text[], %b::text[], %b::bytea[],"
    " %s::timestamptz, %s::integer, %s::text, %b::text[],"
    " %s::boolean, %b::text[], %s::text, %s::timestamptz, %s::integer, %s::boolean, %b::text[], %b::integer[])"
)

_APPLIED, _CLAIMED, _BLOCK, _MESSAGE = 0, 1, 2, 3


def all_finished(outcomes: Sequence[ActivityOutcome]) -> bool:
    """Whether a batch may take this path: not empty, and no outcome a retry."""
    return bool(outcomes) and all(outcome.retry_at is None for outcome in outcomes)


def complete_finished(
    conn: psycopg.Connection,
    q: Statements,
    outcomes: Sequence[ActivityOutcome],
    now: datetime,
    claim: Claim | None,
) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
    """Write finished attempts' outcomes; with ``claim``, claim (and load) workflow tasks as
    ``complete_activity_tasks_then_claim`` does. ``conn`` is in autocommit: the call is its
    own transaction."""
    tasks = [outcome.task for outcome in outcomes]
    messages = []
    for outcome in outcomes:
        message = outcome.message
        assert message is not None  # no retries here (all_finished)
        messages.append(inbox_row(outcome.task.run_id, message, now))
    after = dict(claim.after_seqs) if claim is not None and claim.after_seqs is not None else {}
    rows = conn.execute(
        q(_CALL),
        [
            arrays.texts([task.queue for task in tasks]),
            arrays.int8s([task.task_id for task in tasks]),
            arrays.texts([task.lease.owner for task in tasks]),
            arrays.int4s([task.lease.version for task in tasks]),
            arrays.texts([task.run_id for task in tasks]),
            arrays.texts([kind for _run, kind, _message, _visible in messages]),
            arrays.byteas([message for _run, _kind, message, _visible in messages]),
            now,
            LOCK_SCHEDULE_WORKFLOWS,
            q.schema,
            list(WAKING_KINDS),
            claim is not None,
            sorted(claim.names) if claim is not None else [],
            claim.owner if claim is not None else None,
            now + claim.lease if claim is not None else None,
            claim.limit if claim is not None else 0,
            claim is not None and claim.after_seqs is not None,
            list(after),
            list(after.values()),
        ],
    ).fetchall()
    applied_at: set[int] = set()
    claimed: list[tuple[int, WorkflowTask]] = []
    loads: list[tuple[int, str, int, bytes]] = []
    for part, ord_, task_id, run_id, name, queue, priority, version, n, data in rows:
        if part == _APPLIED:
            applied_at.add(ord_ - 1)
        elif part == _CLAIMED:
            assert claim is not None
            row = (task_id, run_id, name, queue, priority, claim.owner, now + claim.lease, version)
            claimed.append((priority, workflow_task(row)))
        else:
            loads.append((0 if part == _BLOCK else 1, run_id, n, data))
    applied = [index in applied_at for index in range(len(outcomes))]
    tasks_claimed = [task for _priority, task in sorted(claimed, key=lambda item: (-item[0], item[1].task_id))]
    if not tasks_claimed or claim is None or claim.after_seqs is None:
        return applied, tasks_claimed, []
    requests = [(task, after.get(task.run_id, 0)) for task in tasks_claimed]
    return applied, tasks_claimed, workflow_tasks.assemble_loaded(conn, q, requests, loads)
