"""How runs end, on PostgreSQL (docs/reference/contract.md §14): deadlines, the steps a
workflow task cancelled, the runs it started detached, and the endings applied at the call.

* :func:`write_deadline`: a run started with a deadline keeps it in ``runs.deadline`` and
  gets its cancel request (reason "timeout", :func:`dex.domain.task.deadline_message`) in its
  inbox, visible from the deadline, in the start's transaction.
* :func:`drop_cancelled_steps`: a cancelled activity's task goes whether queued or running (a
  running attempt then learns it at its heartbeat, and its outcome finds no task: nothing is
  recorded); a cancelled timer's firing leaves the inbox (found by its exact encoding).
* :func:`insert_detached`: the runs ``ctx.start_workflow`` started; one whose instance id a
  live run holds is kept as a run terminated at once, naming that run
  (:func:`dex.domain.endings.clashed_detached`).

The endings applied at the call (``engine.terminate``, the cancel of a run no engine can run)
are :mod:`dex.adapters.postgres.at_call`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.rows import history_row, inbox_row, insert_history, insert_inbox, labels_json
from dex.adapters.postgres.schema import LIVE, Statements
from dex.domain import events as ev
from dex.domain.endings import clashed_detached
from dex.domain.task import NewRun, deadline_message
from dex.domain.writes import WritePlan
from dex.serialization.values import encode_failure


def write_deadline(conn: psycopg.Connection, q: Statements, run_id: str, created: ev.RunCreated) -> None:
    """Record the deadline of the run just created, and put its cancel request in its inbox."""
    message = deadline_message(run_id, created)
    if message is None:
        return
    conn.execute(q("UPDATE {s}.runs SET deadline = %s WHERE run_id = %s"), [created.deadline, run_id])
    insert_inbox(conn, q, [inbox_row(run_id, message.event, message.visible_from)])


def drop_cancelled_steps(conn: psycopg.Connection, q: Statements, plans: Sequence[tuple[str, WritePlan]]) -> None:
    """Delete the tasks of the activities and the firings of the timers the plans cancelled."""
    steps = [(run_id, seq) for run_id, plan in plans for seq in plan.cancelled_activities]
    if steps:
        # task rows are locked in (queue, task_id) order, as everywhere else, before they are deleted
        conn.execute(
            q(
                "DELETE FROM {s}.activity_tasks t WHERE (t.queue, t.task_id) IN ("
                " SELECT a.queue, a.task_id FROM {s}.activity_tasks a"
                "  JOIN unnest(%b::text[], %b::integer[]) AS c(run_id, created_seq)"
                "   ON a.run_id = c.run_id AND a.created_seq = c.created_seq"
                " ORDER BY a.queue, a.task_id FOR UPDATE OF a)"
            ),
            [arrays.texts([r for r, _ in steps]), arrays.int4s([s for _, s in steps])],
        )
    firings = [
        inbox_row(run_id, ev.TimerElapsed(created_seq=seq), datetime.min)
        for run_id, plan in plans
        for seq in plan.cancelled_timers
    ]
    if firings:
        conn.execute(
            q(
                "DELETE FROM {s}.inbox i USING unnest(%b::text[], %b::bytea[]) AS f(run_id, message)"
                " WHERE i.run_id = f.run_id AND i.kind = 'TimerElapsed' AND i.message = f.message"
            ),
            [arrays.texts([row[0] for row in firings]), arrays.byteas([row[2] for row in firings])],
        )


def insert_detached(
    conn: psycopg.Connection, q: Statements, detached: Sequence[NewRun], now: datetime
) -> tuple[list[NewRun], list[str]]:
    """Create the detached runs: those whose instance id is free as ``create_run`` creates a run
    (returned first: they need their ``RunStarted``), the others as terminated stand-ins; and
    the ids of both, which exist from now on."""
    started: list[NewRun] = []
    for run in detached:
        created = run.created
        row = conn.execute(
            q(
                "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, instance_id, priority,"
                " concurrency_key, labels, parent_run_id, created_at, last_seq, code_version, deadline)"
                " VALUES (%s, %s, %s, 'CREATED', %s, %s, %s, %s, NULL, %s, 1, %s, %s)"
                " ON CONFLICT DO NOTHING RETURNING run_id"
            ),
            [
                run.run_id,
                created.workflow_name,
                created.queue,
                created.instance_id,
                created.priority,
                created.concurrency_key,
                labels_json(created.labels),
                now,
                created.code_version,
                created.deadline,
            ],
        ).fetchone()
        if row is not None:
            insert_history(
                conn, q, [history_row(run.run_id, [ev.HistoryEvent(sequence_number=1, timestamp=now, event=created)])]
            )
            started.append(run)
            continue
        holder = conn.execute(
            q("SELECT run_id FROM {s}.runs WHERE instance_id = %s AND status IN " + LIVE), [created.instance_id]
        ).fetchone()
        exists = conn.execute(q("SELECT 1 FROM {s}.runs WHERE run_id = %s"), [run.run_id]).fetchone()
        if exists is not None:
            continue  # (never: its id is derived from the starting run's history)
        _insert_stand_in(conn, q, run, str(holder[0]) if holder is not None else "(unknown)", now)
    return started, [run.run_id for run in detached]


def _insert_stand_in(conn: psycopg.Connection, q: Statements, run: NewRun, holder: str, now: datetime) -> None:
    history = clashed_detached(run, holder, now)
    completion = history[-2].event
    assert isinstance(completion, ev.RunCompleted) and completion.failure is not None
    created = run.created
    conn.execute(
        q(
            "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, instance_id, priority,"
            " concurrency_key, labels, parent_run_id, created_at, completed_at, failure, last_seq, code_version)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, %s, %s, %s, %s, %s)"
        ),
        [
            run.run_id,
            created.workflow_name,
            created.queue,
            completion.status.value,
            created.instance_id,
            created.priority,
            created.concurrency_key,
            labels_json(created.labels),
            now,
            now,
            encode_failure(completion.failure),
            history[-1].sequence_number,
            created.code_version,
        ],
    )
    insert_history(conn, q, [history_row(run.run_id, history[:1]), history_row(run.run_id, history[1:])])
