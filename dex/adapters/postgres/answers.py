"""Answered steps (:class:`~dex.app.ports.store.AnsweredStep`) in a workflow completion: the checks
that decide whether one applies, sent in the completion's pipeline with its other locks.

A step applies while the activity's claim holds, and its run is RUNNING (locked by the
completion already), has no workflow task and no visible message (what it was sent comes
first: its workflow task takes it all, in order), and its workflow queue is not paused. (Not
whether the queue has room: a step answered in the attempt's thread takes no slot of it.)
:mod:`.completion` reads both answers
with the run locks and deletes the answered activities' tasks with the rest of its writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import AnsweredStep

# Of the runs answered steps are for, those that may take one: RUNNING (locked already by the
# batch), no task and no visible message of theirs, their workflow queue not paused
_OPEN_RUNS = (
    "SELECT r.run_id FROM {s}.runs r JOIN {s}.queues qu ON qu.name = r.queue AND qu.kind = 'workflow'"
    " WHERE r.run_id = ANY(%b::text[]) AND r.status = 'RUNNING' AND NOT qu.paused"
    "   AND NOT EXISTS (SELECT 1 FROM {s}.workflow_tasks t WHERE t.run_id = r.run_id AND t.queue = r.queue)"
    "   AND NOT EXISTS (SELECT 1 FROM {s}.inbox i WHERE i.run_id = r.run_id AND i.visible_from <= %s)"
)


def send_checks(
    conn: psycopg.Connection, q: Statements, answers: Sequence[AnsweredStep], now: datetime
) -> tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]]:
    """Lock the answered activities' task rows (``FOR UPDATE``, in (queue, task_id) order,
    after the runs: the lock order of every completion) with their current claims, and find
    the runs that may take an answer; both sent, neither read (a pipeline goes on)."""
    activities = [answer.outcome.task for answer in answers]
    holding = conn.execute(
        q(
            "SELECT t.queue, t.task_id, t.locked_by, t.lock_version FROM {s}.activity_tasks t"
            " WHERE (t.queue, t.task_id) IN (SELECT w.queue, w.task_id FROM "
            "  unnest(%b::text[], %b::bigint[]) AS w(queue, task_id))"
            " ORDER BY t.queue, t.task_id FOR UPDATE OF t"
        ),
        [arrays.texts([t.queue for t in activities]), arrays.int8s([t.task_id for t in activities])],
    )
    opening = conn.execute(q(_OPEN_RUNS), [arrays.texts(sorted({answer.run_id for answer in answers})), now])
    return holding, opening


def checks(
    sent: tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]] | None,
) -> tuple[dict[tuple[str, int], tuple[str | None, int]], set[str]]:
    """The answered activities' claims (owner, version) by (queue, task_id), and the open runs."""
    if sent is None:
        return {}, set()
    holding, opening = sent
    held = {(queue, task_id): (owner, version) for queue, task_id, owner, version in holding.fetchall()}
    return held, {row[0] for row in opening.fetchall()}
