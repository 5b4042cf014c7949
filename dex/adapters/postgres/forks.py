"""The PostgreSQL adapter's forks (docs/reference/contract.md §11): a run created from a prefix of another's history.

A fork is one transaction. The run's row is inserted as the schema's ``create_run`` inserts
one (status CREATED, history ``[RunCreated]``, inbox ``[RunStarted]``), with ``forked_from``
(migration 8); for a fork past the start, a workflow task of the run is inserted already
claimed, and :meth:`dex.domain.forks.Fork.first_task` is applied as its result by
:func:`dex.adapters.postgres.completion.complete_workflow_tasks`, the code that applies every
worker's result: the copied history, status RUNNING, the activity tasks, timers and children
are written as any task's are. If anything fails, the transaction rolls back and nothing of
the fork remains.

Locks: the run row is new, so nobody waits on it until the commit; the live-instance index
decides a clash on the instance id (``ON CONFLICT DO NOTHING``, as ``create_run``: an insert
racing with ours waits for our commit). The completion then locks the fork's row and takes
the rows it makes, as for any result.

:class:`PostgresForks` is a part of :class:`dex.adapters.postgres.PostgresAdapter`.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from dex.adapters.postgres import completion
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.rows import history_row, inbox_row, insert_history, labels_json
from dex.adapters.postgres.schema import LIVE, Statements
from dex.app.ports.store import ACTIVITY, WORKFLOW, Lease, WorkflowTask
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError
from dex.domain.forks import Fork

_FORKER = "dex-fork"  # the owner of the fork's first task, claimed and completed in one transaction

_INSERT_RUN = (
    "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, instance_id, priority, concurrency_key,"
    " labels, parent_run_id, created_at, last_seq, code_version, forked_from)"
    " VALUES (%s, %s, %s, 'CREATED', %s, %s, %s, %s, NULL, %s, %s, %s, %s)"
    # the arbiter is the partial unique index runs_live_instance, as in create_run
    " ON CONFLICT (instance_id) WHERE instance_id IS NOT NULL AND status IN " + LIVE + " DO NOTHING"
    " RETURNING run_id"
)


class PostgresForks:
    """The fork port of the PostgreSQL adapter."""

    def __init__(self, db: Database, q: Statements, queues: PostgresQueues) -> None:
        self._db = db
        self._q = q
        self._queues = queues

    def create_fork(self, fork: Fork, now: datetime) -> str:
        # the queues the fork uses get their rows and partitions first, in transactions of
        # their own (DDL), so that the fork's transaction only inserts rows
        needed = [(fork.created.queue, WORKFLOW)]
        needed += [(task.queue, ACTIVITY) for task in fork.activity_tasks]
        needed += [(child.created.queue, WORKFLOW) for child in fork.child_runs]
        self._queues.ensure_all(needed)
        with self._db.transaction() as conn:
            create_fork(conn, self._q, fork, now)
        return fork.run_id


def create_fork(conn: psycopg.Connection, q: Statements, fork: Fork, now: datetime) -> None:
    """Write ``fork`` in the caller's transaction; InvalidStateError if a live run holds its
    instance id (the caller's transaction then rolls back)."""
    created, first = fork.created, fork.history[0]
    inserted = conn.execute(
        q(_INSERT_RUN),
        [
            fork.run_id,
            created.workflow_name,
            created.queue,
            created.instance_id,
            created.priority,
            created.concurrency_key,
            labels_json(created.labels),
            now,
            first.sequence_number,
            created.code_version,
            fork.forked_from,
        ],
    ).fetchone()
    if inserted is None:
        holder = conn.execute(
            q("SELECT run_id FROM {s}.runs WHERE instance_id = %s AND status IN " + LIVE), [created.instance_id]
        ).fetchone()
        who = f"run {holder[0]}, which is live" if holder is not None else "a live run"
        raise InvalidStateError(
            f"instance id {created.instance_id!r} is in use by {who};"
            " a fork takes its original's instance id: cancel that run first, or wait for it to end"
        )
    insert_history(conn, q, [history_row(fork.run_id, [first])])
    row = conn.execute(
        q("INSERT INTO {s}.inbox (run_id, kind, message, visible_from) VALUES (%s, %s, %s, %s) RETURNING message_id"),
        list(inbox_row(fork.run_id, ev.RunStarted(), now)),
    ).fetchone()
    assert row is not None
    if not fork.started:
        return  # a fork from the start: its RunStarted makes its first task, as for a new run
    task_row = conn.execute(
        q(
            "INSERT INTO {s}.workflow_tasks (queue, run_id, workflow_name, priority, locked_by, locked_until,"
            " lock_version) VALUES (%s, %s, %s, %s, %s, %s, 1) RETURNING task_id"
        ),
        [created.queue, fork.run_id, created.workflow_name, created.priority, _FORKER, now],
    ).fetchone()
    assert task_row is not None
    task = WorkflowTask(
        task_id=int(task_row[0]),
        run_id=fork.run_id,
        workflow_name=created.workflow_name,
        queue=created.queue,
        lease=Lease(owner=_FORKER, until=now, version=1),
    )
    applied = completion.complete_workflow_tasks(conn, q, [(task, fork.first_task(int(row[0])))], now)
    if applied != [True]:  # pragma: no cover - the run and its task are this transaction's own
        raise AssertionError(f"the fork {fork.run_id} could not be written")
