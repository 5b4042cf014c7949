"""Completing workflow tasks: a whole batch of results applied in one transaction.

What one result writes is the domain's :class:`~dex.domain.writes.WritePlan`: drop the task;
if the run's history still ends at ``expected_last_seq``, execute the plan (the history
block, or a whole new history that keeps only the surviving messages, the consumed messages,
status, child runs with :func:`~dex.domain.writes.instance_clash` for those whose instance id
is held, activity tasks and messages; when the run ends, its inbox and activity tasks go).
Messages to unknown or ended runs are dropped.

How the batch stays cheap and safe:

* Every run the batch touches (the tasks' runs and every message target) is locked
  ``FOR NO KEY UPDATE`` in one statement, in run id order, so two batches cannot deadlock and
  a racing duplicate of a task waits here, then finds ``last_seq`` moved on and is discarded.
  The same lock keeps retention, which deletes only ended runs it can lock, off those runs.
* The tasks whose lease still holds are deleted in one statement; the others are discarded.
* The checks are then made in Python against the locked rows (check-before-apply), so a
  discarded result never breaks the rest of the batch, and the writes of all applied results
  go out as a handful of multi-row statements (``unnest``). A run that appears twice in a
  batch starts a new round, so every round touches each run once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

import attrs
import psycopg

from dex.adapters.postgres import answers as answers_sql
from dex.adapters.postgres import arrays, attempts, endings, instance_children, instances, stream_writes
from dex.adapters.postgres.rows import (
    HistoryRow,
    InboxRow,
    history_row,
    inbox_row,
    insert_history,
    insert_inbox,
    labels_json,
)
from dex.adapters.postgres.schema import Statements
from dex.adapters.postgres.update_answers import answer_channel, answers_insert
from dex.app.ports.store import AnsweredStep, WorkflowTask
from dex.domain import events as ev
from dex.domain.endings import kept_activity_tasks, kept_messages
from dex.domain.status import RunStatus
from dex.domain.task import NO_EFFECTS, NewRun, UpdateAnswer, WorkflowTaskResult
from dex.domain.writes import SURVIVING_KINDS, WritePlan, instance_clash, plan_write
from dex.serialization.values import encode_failure, encode_payload, encode_payloads, encode_retry_policy

Item = tuple[WorkflowTask, WorkflowTaskResult]


@attrs.define
class LockedRun:
    """What the batch knows of a locked run; updated as results apply."""

    status: RunStatus
    last_seq: int


def complete_workflow_tasks(
    conn: psycopg.Connection, q: Statements, results: Sequence[Item], now: datetime
) -> list[bool]:
    if not results:
        return []
    targets = {task.run_id for task, _ in results}
    targets.update(message.run_id for _, result in results for message in result.messages)
    # both statements are sent before either answer is read (one round trip in a pipeline);
    # the server runs them in order, so the runs are locked before the tasks, as everywhere
    locking = conn.execute(
        q(
            "SELECT run_id, status, last_seq FROM {s}.runs WHERE run_id = ANY(%b::text[])"
            " ORDER BY run_id FOR NO KEY UPDATE"
        ),
        [arrays.texts(sorted(targets))],
    )
    tasks = [task for task, _ in results if not isinstance(task, AnsweredStep)]
    answers = [task for task, _ in results if isinstance(task, AnsweredStep)]
    # the lease check: only tasks still held by this owner at this lock_version are deleted
    deleting = (
        conn.execute(
            q(
                "DELETE FROM {s}.workflow_tasks t"
                " USING unnest(%b::text[], %b::bigint[], %b::text[], %b::integer[])"
                "  AS l(queue, task_id, owner, version)"
                " WHERE t.queue = l.queue AND t.task_id = l.task_id"
                "   AND t.locked_by = l.owner AND t.lock_version = l.version"
                " RETURNING t.queue, t.task_id"
            ),
            claims(tasks),
        )
        if tasks
        else None
    )
    answering = answers_sql.send_checks(conn, q, answers, now) if answers else None
    child_ids = {
        c.created.instance_id
        for _, r in results
        if r.child_runs or r.effects is not None
        for c in (*r.child_runs, *r.detached_runs)
        if c.created.instance_id is not None
    }
    trying = instances.send_tries(conn, q, child_ids) if child_ids else None
    runs = {run_id: LockedRun(RunStatus(status), last_seq) for run_id, status, last_seq in locking.fetchall()}
    deleted = {(row[0], row[1]) for row in deleting.fetchall()} if deleting is not None else set()
    held, open_runs = answers_sql.checks(answering)
    in_flight = instances.held_elsewhere(trying)  # started in a transaction still open
    answered: list[tuple[str, int]] = []
    applied: list[bool] = []
    batch = WriteRound(conn, q, runs, now)
    for task, result in results:
        run = runs.get(task.run_id)
        # a child's instance id held by a start in a transaction still open: not now (instances.py)
        waits = bool(in_flight) and any(
            child.created.instance_id in in_flight for child in (*result.child_runs, *result.detached_runs)
        )
        if isinstance(task, AnsweredStep):
            activity = task.outcome.task
            key = (activity.queue, activity.task_id)
            if (
                held.get(key) != (activity.lease.owner, activity.lease.version)
                or task.outcome.retry_at is not None
                or task.run_id not in open_runs
                or run is None
                or run.last_seq != result.expected_last_seq  # (a result earlier in the batch moved it)
                or waits
            ):
                applied.append(False)  # nothing written: the engine writes the outcome the ordinary way
                continue
            del held[key]  # the claim is used up
            answered.append(key)
        else:
            key = (task.queue, task.task_id)
            if key not in deleted:
                applied.append(False)  # the lease was lost: another worker owns (or finished) this task
                continue
            deleted.discard(key)  # a second result for the same claim finds the task gone
            if run is None or run.last_seq != result.expected_last_seq:
                applied.append(False)  # a racing duplicate already wrote this part of the history
                continue
            if waits:
                applied.append(False)  # its task's messages stay in the inbox: a new task tries again
                continue
        if task.run_id in batch.touched:
            batch.flush()
            batch = WriteRound(conn, q, runs, now)
        batch.add(task.run_id, run, result)
        applied.append(True)
    if answered:  # the answered activities' tasks go: their outcomes are in the runs' histories
        conn.execute(
            q(
                "DELETE FROM {s}.activity_tasks t USING unnest(%b::text[], %b::bigint[]) AS d(queue, task_id)"
                " WHERE t.queue = d.queue AND t.task_id = d.task_id"
            ),
            [arrays.texts([queue for queue, _ in answered]), arrays.int8s([task_id for _, task_id in answered])],
        )
    batch.flush()
    return applied


def claims(tasks: Sequence[WorkflowTask]) -> list[object]:
    """The (queue, task_id, owner, version) arrays of workflow tasks' claims, for an ``unnest``."""
    return [
        arrays.texts([task.queue for task in tasks]),
        arrays.int8s([task.task_id for task in tasks]),
        arrays.texts([task.lease.owner for task in tasks]),
        arrays.int4s([task.lease.version for task in tasks]),
    ]


@attrs.frozen(kw_only=True)
class _RunUpdate:
    """What one applied result changes in its run's row: a row of :meth:`WriteRound._update_runs`'s
    ``unnest`` (``result`` and ``failure`` encoded; they count only when ``finished``)."""

    run_id: str
    status: str
    started: bool
    sets_custom_status: bool
    custom_status: str | None
    last_seq: int
    finished: bool
    result: bytes | None
    failure: bytes | None
    labels: str | None  # the run's whole new label set (JSON), when ctx.set_labels changed it
    unread_events: int


class WriteRound:
    """The writes of results for distinct runs, gathered and then issued in bulk."""

    def __init__(self, conn: psycopg.Connection, q: Statements, runs: dict[str, LockedRun], now: datetime) -> None:
        self._conn, self._q, self._runs, self._now = conn, q, runs, now
        self.touched: set[str] = set()
        self._plans: list[tuple[str, WritePlan]] = []
        # the plans with any effect of docs/decisions/conversations.md (answers, published values,
        # streams, labels, cancelled steps, detached runs): most tasks have none, and their
        # statements then look at no plan at all
        self._effectful: list[tuple[str, WritePlan]] = []
        self._consumed: list[int] = []
        self._reset: list[str] = []
        self._history: list[HistoryRow] = []
        self._updates: list[_RunUpdate] = []
        # children started under id_reuse that an ended run answers: the message to their parent
        self._answered: dict[str, ev.Message] = {}
        self._answers: list[tuple[str, UpdateAnswer]] = []  # engine.update's answers (updates.py)

    def add(self, run_id: str, run: LockedRun, result: WorkflowTaskResult) -> None:
        plan = plan_write(result, run.status)
        self.touched.add(run_id)
        self._plans.append((run_id, plan))
        effects = plan.effects
        if effects is not NO_EFFECTS:
            self._effectful.append((run_id, plan))
            self._answers.extend((run_id, answer) for answer in effects.update_answers)
        if plan.consumed:
            self._consumed.extend(plan.consumed)
        if plan.replaces_history:
            self._reset.append(run_id)
        if plan.last_seq is not None:
            run.last_seq = plan.last_seq
        if plan.events:
            self._history.append(history_row(run_id, plan.events))  # the task's events: one block, one row
        run.status = plan.status
        completion = plan.completion
        self._updates.append(
            _RunUpdate(
                run_id=run_id,
                status=plan.status.value,
                started=plan.started,
                sets_custom_status=plan.sets_custom_status,
                custom_status=plan.custom_status,
                last_seq=run.last_seq,
                finished=completion is not None,
                result=encode_payload(completion.result)
                if completion is not None and completion.result is not None
                else None,
                failure=encode_failure(completion.failure)
                if completion is not None and completion.failure is not None
                else None,
                labels=json.dumps(dict(effects.labels)) if effects.labels is not None else None,
                unread_events=effects.unread_events,
            )
        )

    def flush(self) -> None:
        if not self._plans:
            return
        conn, q = self._conn, self._q
        if self._consumed:
            conn.execute(
                q("DELETE FROM {s}.inbox WHERE message_id = ANY(%b::bigint[]) AND run_id = ANY(%b::text[])"),
                [arrays.int8s(self._consumed), arrays.texts(sorted(self.touched))],
            )
        if self._reset:
            conn.execute(
                # continue-as-new: of the unconsumed messages only the domain's survivors stay
                q("DELETE FROM {s}.inbox WHERE run_id = ANY(%b::text[]) AND kind <> ALL(%b::text[])"),
                [self._reset, list(SURVIVING_KINDS)],
            )
            conn.execute(q("DELETE FROM {s}.history WHERE run_id = ANY(%b::text[])"), [self._reset])
        self._update_runs()
        if self._effectful:
            endings.drop_cancelled_steps(conn, q, self._effectful)
        children = self._insert_children()
        insert_history(conn, q, self._history + [history_row(c.run_id, [_first_event(c, self._now)]) for c in children])
        detached = [run for _, plan in self._effectful for run in plan.detached_runs]
        started: list[NewRun] = []
        if detached:
            started, made = endings.insert_detached(conn, q, detached, self._now)
            for run_id in made:
                self._runs.setdefault(run_id, LockedRun(RunStatus.TERMINATED, 0))
            for run in started:  # (a stand-in is terminated: messages to it are dropped)
                self._runs[run.run_id] = LockedRun(RunStatus.CREATED, 1)
        # published values and stream items, with the history
        if self._effectful:
            stream_writes.write_plans(conn, q, self._effectful, self._now)
        self._insert_activity_tasks()
        finished = [run_id for run_id, plan in self._plans if plan.ends_run]
        if finished:
            # the ended runs' remaining messages and activity tasks go; task rows are locked in
            # (queue, task_id) order, as everywhere else, before they are deleted
            # update requests that came after the run's last task was loaded go with the inbox:
            # their callers are woken and read the run's end as the refusal (updates.py). Nothing
            # is read back here: a fetch would wait for the server in the middle of the write
            conn.execute(
                q(
                    "WITH gone AS (DELETE FROM {s}.inbox WHERE run_id = ANY(%b::text[]) RETURNING run_id, kind)"
                    " SELECT pg_notify(%s, g.run_id)"
                    " FROM (SELECT DISTINCT run_id FROM gone WHERE kind = 'UpdateRequested') AS g"
                ),
                [arrays.texts(finished), answer_channel(q.schema)],
            )
            conn.execute(
                q(
                    "DELETE FROM {s}.activity_tasks t WHERE (t.queue, t.task_id) IN ("
                    " SELECT queue, task_id FROM {s}.activity_tasks WHERE run_id = ANY(%b::text[])"
                    " ORDER BY queue, task_id FOR UPDATE)"
                ),
                [arrays.texts(finished)],
            )
        insert_inbox(conn, q, self._messages({c.run_id for c in children}, started))
        for statement in answers_insert(q, answer_channel(q.schema), self._answers, self._now):
            conn.execute(*statement)

    def _update_runs(self) -> None:
        updates = self._updates
        self._conn.execute(
            self._q(
                "UPDATE {s}.runs r SET status = u.status,"
                " started_at = CASE WHEN u.started THEN %s ELSE r.started_at END,"
                " custom_status = CASE WHEN u.set_custom THEN u.custom_status ELSE r.custom_status END,"
                " last_seq = u.last_seq,"
                " completed_at = CASE WHEN u.finished THEN %s ELSE r.completed_at END,"
                " result = CASE WHEN u.finished THEN u.result ELSE r.result END,"
                " failure = CASE WHEN u.finished THEN u.failure ELSE r.failure END,"
                " holds_key = r.holds_key AND NOT u.finished,"
                " labels = COALESCE(u.labels::jsonb, r.labels),"
                " unread_events = CASE WHEN u.finished THEN u.unread_events ELSE r.unread_events END,"
                " task_failure = NULL"  # a result applied: the run is not held (any more)
                " FROM unnest(%b::text[], %b::text[], %b::boolean[], %b::boolean[], %b::text[], %b::integer[],"
                "             %b::boolean[], %b::bytea[], %b::bytea[], %b::text[], %b::integer[])"
                "  AS u(run_id, status, started, set_custom, custom_status, last_seq, finished, result, failure,"
                "       labels, unread_events)"
                " WHERE r.run_id = u.run_id"
            ),
            [
                self._now,
                self._now,
                arrays.texts([u.run_id for u in updates]),
                arrays.texts([u.status for u in updates]),
                arrays.bools([u.started for u in updates]),
                arrays.bools([u.sets_custom_status for u in updates]),
                arrays.texts([u.custom_status for u in updates]),
                arrays.int4s([u.last_seq for u in updates]),
                arrays.bools([u.finished for u in updates]),
                arrays.byteas([u.result for u in updates]),
                arrays.byteas([u.failure for u in updates]),
                arrays.texts([u.labels for u in updates]),
                arrays.int4s([u.unread_events for u in updates]),
            ],
        )

    def _insert_children(self) -> list[NewRun]:
        """Insert the child runs; return those created (the others clashed on instance id)."""
        children = [child for _, plan in self._plans for child in plan.child_runs]
        keyed = [child for child in children if not child.rule.plain]
        if keyed:  # id_reuse (instance_children.py): an ended run of the id may answer instead
            self._answered = instance_children.answered_children(self._conn, self._q, keyed, self._now)
            children = [child for child in children if child.run_id not in self._answered]
        if not children:
            return []
        created = [child.created for child in children]
        # DO NOTHING on any unique conflict: the live-instance index decides clashes, also
        # between two children of this very batch (the first one wins), and never aborts the batch
        rows = self._conn.execute(
            self._q(
                "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, instance_id, priority,"
                " concurrency_key, labels, parent_run_id, created_at, last_seq, code_version, deadline)"
                " SELECT c.run_id, c.workflow_name, c.queue, 'CREATED', c.instance_id, c.priority,"
                "  c.concurrency_key, c.labels, c.parent_run_id, %s, 1, c.code_version, c.deadline"
                " FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::integer[], %b::text[],"
                "             %b::jsonb[], %b::text[], %b::text[], %b::timestamptz[]) WITH ORDINALITY"
                "  AS c(run_id, workflow_name, queue, instance_id, priority, concurrency_key, labels, parent_run_id,"
                "       code_version, deadline, ord)"
                " ORDER BY c.ord"
                " ON CONFLICT DO NOTHING RETURNING run_id"
            ),
            [
                self._now,
                [child.run_id for child in children],
                [c.workflow_name for c in created],
                [c.queue for c in created],
                [c.instance_id for c in created],
                [c.priority for c in created],
                [c.concurrency_key for c in created],
                [labels_json(c.labels) for c in created],
                [c.parent_run_id for c in created],
                [c.code_version for c in created],
                [c.deadline for c in created],
            ],
        ).fetchall()
        inserted = {row[0] for row in rows}
        for child in children:
            if child.run_id in inserted:
                self._runs[child.run_id] = LockedRun(RunStatus.CREATED, 1)
        return [child for child in children if child.run_id in inserted]

    def _insert_activity_tasks(self) -> None:
        specs = [
            spec
            for _, plan in self._plans
            if plan.activity_tasks and not plan.status.is_terminal
            for spec in kept_activity_tasks(plan)
        ]
        if not specs:
            return
        self._conn.execute(
            self._q(
                "INSERT INTO {s}.activity_tasks (queue, run_id, created_seq, name, input, priority,"
                " retry_policy, lock_timeout, visible_from, trace_context, attempt)"
                " SELECT a.queue, a.run_id, a.created_seq, a.name, a.input, a.priority, a.retry_policy,"
                "  a.lock_timeout, a.visible_from, a.trace_context, a.attempt"
                " FROM unnest(%b::text[], %b::text[], %b::integer[], %b::text[], %b::bytea[], %b::integer[],"
                "             %b::bytea[], %b::interval[], %b::timestamptz[], %b::text[], %b::integer[])"
                "  WITH ORDINALITY AS a(queue, run_id, created_seq, name, input, priority, retry_policy,"
                "       lock_timeout, visible_from, trace_context, attempt, ord)"
                " ORDER BY a.ord"
            ),
            [
                arrays.texts([s.queue for s in specs]),
                arrays.texts([s.run_id for s in specs]),
                arrays.int4s([s.created_seq for s in specs]),
                arrays.texts([s.name for s in specs]),
                arrays.byteas([encode_payloads(s.input) for s in specs]),
                arrays.int4s([s.priority for s in specs]),
                arrays.byteas([encode_retry_policy(s.retry_policy) for s in specs]),
                arrays.intervals([s.lock_timeout for s in specs]),
                arrays.timestamptzs([s.visible_from for s in specs]),
                arrays.texts([json.dumps(dict(s.trace_context)) if s.trace_context else None for s in specs]),
                arrays.int4s([s.attempt for s in specs]),
            ],
        )
        # a task retrying a first attempt that ran inside the workflow task: that attempt failed
        failures = attempts.record_inline_failures(self._q, specs, self._now)
        if failures is not None:
            self._conn.execute(*failures)

    def _messages(self, created_children: set[str], detached: Sequence[NewRun] = ()) -> list[InboxRow]:
        """Inbox rows in the order the in-memory adapter would append them, for live runs only.

        A run that ended in this batch ends with an empty inbox, whatever was sent to it before
        or after it ended, so its messages are simply not written.
        """
        rows: list[InboxRow] = []
        started = {run.run_id for run in detached}

        def deliver(run_id: str, message: ev.Message, visible_from: datetime) -> None:
            run = self._runs.get(run_id)
            if run is not None and not run.status.is_terminal:
                rows.append(inbox_row(run_id, message, visible_from))

        for run_id, plan in self._plans:
            for child in plan.child_runs:
                if child.run_id in created_children:
                    deliver(child.run_id, ev.RunStarted(), self._now)
                elif child.run_id in self._answered:
                    deliver(run_id, self._answered[child.run_id], self._now)
                else:
                    deliver(run_id, instance_clash(child), self._now)
            for run in plan.detached_runs:
                if run.run_id in started:
                    deliver(run.run_id, ev.RunStarted(), self._now)
            for message in kept_messages(run_id, plan):
                deliver(message.run_id, message.event, message.visible_from)
        return rows


def _first_event(child: NewRun, now: datetime) -> ev.HistoryEvent:
    return ev.HistoryEvent(sequence_number=1, timestamp=now, event=child.created)
