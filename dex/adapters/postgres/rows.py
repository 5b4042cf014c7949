"""Rows to domain values and back, and the bulk inserts that several operations share.

Events, messages, payloads, failures and retry policies are stored as protobuf bytes through
:mod:`dex.serialization.history`; the columns beside them (status, kind, times) exist so that
SQL can filter and order without decoding anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import Statements
from dex.app.ports.store import ActivityTask, Lease, RunRecord, WorkflowTask
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.serialization.history import encode_block, encode_message
from dex.serialization.values import decode_failure, decode_payload, decode_payloads, decode_retry_policy

RUN_COLUMNS = (
    "run_id, workflow_name, queue, status, instance_id, priority, concurrency_key, labels, parent_run_id,"
    " created_at, started_at, completed_at, custom_status, result, failure, code_version, task_failure, forked_from,"
    " deadline, unread_events"
)

WORKFLOW_TASK_COLUMNS = "task_id, run_id, workflow_name, queue, priority, locked_by, locked_until, lock_version"

ACTIVITY_TASK_COLUMNS = (
    "task_id, run_id, created_seq, name, input, queue, priority, attempt, retry_policy, lock_timeout,"
    " locked_by, locked_until, lock_version, trace_context"
)

InboxRow = tuple[str, str, bytes, datetime]  # run_id, kind, message, visible_from
HistoryRow = tuple[str, int, int, bytes]  # run_id, first_seq, last_seq, events (a block)


def run_record(row: Sequence[Any]) -> RunRecord:
    """A RunRecord from a row selected with :data:`RUN_COLUMNS`."""
    (run_id, workflow_name, queue, status, instance_id, priority, key, labels, parent,
     created_at, started_at, completed_at, custom_status, result, failure, code_version, task_failure,
     forked_from, deadline, unread_events) = row  # fmt: skip
    return RunRecord(
        run_id=run_id,
        workflow_name=workflow_name,
        queue=queue,
        status=RunStatus(status),
        instance_id=instance_id,
        priority=priority,
        concurrency_key=key,
        labels=tuple(sorted(labels.items())),
        parent_run_id=parent,
        created_at=created_at,
        started_at=started_at,
        completed_at=completed_at,
        custom_status=custom_status,
        result=decode_payload(result) if result is not None else None,
        failure=decode_failure(failure) if failure is not None else None,
        code_version=code_version,
        task_failure=decode_failure(task_failure) if task_failure is not None else None,
        forked_from=forked_from,
        deadline=deadline,
        unread_events=unread_events,
    )


def labels_json(labels: ev.Labels) -> Jsonb:
    return Jsonb(dict(labels))


def workflow_task(row: Sequence[Any]) -> WorkflowTask:
    """A claimed WorkflowTask from a row selected with :data:`WORKFLOW_TASK_COLUMNS`."""
    task_id, run_id, workflow_name, queue, _priority, owner, until, version = row
    return WorkflowTask(
        task_id=task_id,
        run_id=run_id,
        workflow_name=workflow_name,
        queue=queue,
        lease=Lease(owner=owner, until=until, version=version),
    )


def activity_task(row: Sequence[Any]) -> ActivityTask:
    """A claimed ActivityTask from a row selected with :data:`ACTIVITY_TASK_COLUMNS`."""
    (task_id, run_id, created_seq, name, input_, queue, priority, attempt, retry_policy, lock_timeout,
     owner, until, version, trace_context) = row  # fmt: skip
    return ActivityTask(
        task_id=task_id,
        run_id=run_id,
        created_seq=created_seq,
        name=name,
        input=decode_payloads(input_),
        queue=queue,
        priority=priority,
        attempt=attempt,
        retry_policy=decode_retry_policy(retry_policy),
        lock_timeout=lock_timeout,
        lease=Lease(owner=owner, until=until, version=version),
        trace_context=tuple(sorted(json.loads(trace_context).items())) if trace_context else (),
    )


def inbox_row(run_id: str, message: ev.Message, visible_from: datetime) -> InboxRow:
    # the kind column lets the scheduler see a RunCancelled without decoding messages
    return (run_id, type(message).__name__, encode_message(message), visible_from)


def history_row(run_id: str, events: Sequence[ev.HistoryEvent]) -> HistoryRow:
    """One row of ``history``: consecutive events of a run (at least one) as one block."""
    return (run_id, events[0].sequence_number, events[-1].sequence_number, encode_block(events))


def insert_inbox(conn: psycopg.Connection, q: Statements, rows: Sequence[InboxRow]) -> None:
    """Append messages; message ids follow the order of ``rows`` (one statement for all)."""
    inserting = inbox_insert(q, rows)
    if inserting is not None:
        conn.execute(*inserting)


def inbox_insert(q: Statements, rows: Sequence[InboxRow]) -> tuple[Any, list[Any]] | None:
    """:func:`insert_inbox`'s statement and parameters (None for no rows)."""
    if not rows:
        return None
    run_ids, kinds, messages, visible = zip(*rows, strict=True)
    return (
        q(
            "INSERT INTO {s}.inbox (run_id, kind, message, visible_from)"
            " SELECT m.run_id, m.kind, m.message, m.visible_from"
            " FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::timestamptz[]) WITH ORDINALITY"
            "  AS m(run_id, kind, message, visible_from, ord)"
            " ORDER BY m.ord"
        ),
        [list(run_ids), list(kinds), list(messages), list(visible)],
    )


def insert_history(conn: psycopg.Connection, q: Statements, rows: Sequence[HistoryRow]) -> None:
    """Append history blocks; the (run_id, first_seq) primary key refuses a duplicate."""
    if not rows:
        return
    run_ids, firsts, lasts, blocks = zip(*rows, strict=True)
    conn.execute(
        q(
            "INSERT INTO {s}.history (run_id, first_seq, last_seq, events)"
            " SELECT * FROM unnest(%b::text[], %b::integer[], %b::integer[], %b::bytea[])"
        ),
        [arrays.texts(run_ids), arrays.int4s(firsts), arrays.int4s(lasts), arrays.byteas(blocks)],
    )
