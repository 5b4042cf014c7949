"""Keyed starts on PostgreSQL (docs/reference/contract.md §15: ``id_reuse`` and ``debounce``).

A start whose instance id may name an ended or a waiting run reads that id's latest run and
then writes, two steps that another start of the same id must not come between (two starts
under ``"never"`` would both see no run and both make one, if a run of the id ended in between
the live-run index would not stop the second). So each such start first takes the instance
id's transaction-scoped advisory lock (:func:`.instances.hold`, the lock a start in the
application's transaction takes already, and which a completion starting a child of that id
only tries): starts of one id queue there, each reads after the one before it committed (at
READ COMMITTED every statement sees what committed before it began), and starts of other ids
are not held up. The lookup is one probe of the ``runs_instance`` index (migration 14).

Debouncing a waiting run rewrites its first history block (the ``RunCreated`` with the new
arguments) and moves its ``RunStarted`` message's ``visible_from``; it holds the run's row ``FOR
NO KEY UPDATE`` (the lock a completion of the run's tasks takes) and checks again, under it,
that the run is still waiting: CREATED, its history one event long, no workflow task made for
it, its start not yet due, nothing else in its inbox. That last condition is what keeps a
worker from holding the old arguments: a task is made for a run only when a message of its is
visible, the only one a waiting run has is its ``RunStarted``, not yet visible, and a message
sent to it takes the run's row ``FOR SHARE``, so it waits for the debounce's commit (and the
run is no longer waiting after it).

Children a workflow task starts under ``id_reuse`` are made in the task's completion
(:mod:`.instance_children`).
"""

from __future__ import annotations

from datetime import datetime

import attrs
import psycopg

from dex.adapters.postgres import instances, runs
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.direct import DirectStatement
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.refusals import refusals
from dex.adapters.postgres.rows import history_row
from dex.adapters.postgres.schema import LIVE, Statements
from dex.adapters.postgres.transactions import caller_connection
from dex.app.ports.store import WORKFLOW
from dex.domain import events as ev
from dex.domain.instance_keys import Create, Debounce, LatestRun, Reuse, StartRule, decide
from dex.domain.status import RunStatus
from dex.serialization.history import decode_block

# the live run of the id if there is one (the partial unique index), else its newest
_LATEST = (
    "SELECT r.run_id, r.workflow_name, r.status, r.created_at,"
    " r.status = 'CREATED' AND r.last_seq = 1"
    "  AND NOT EXISTS (SELECT 1 FROM {s}.workflow_tasks w WHERE w.run_id = r.run_id)"
    "  AND EXISTS (SELECT 1 FROM {s}.inbox i WHERE i.run_id = r.run_id AND i.kind = 'RunStarted'"
    "   AND i.visible_from > %(now)s)"
    "  AND NOT EXISTS (SELECT 1 FROM {s}.inbox i WHERE i.run_id = r.run_id AND i.kind <> 'RunStarted')"
    " FROM ((SELECT run_id, 0 AS o FROM {s}.runs WHERE instance_id = %(id)s AND status IN " + LIVE + " LIMIT 1)"
    "  UNION ALL (SELECT run_id, 1 FROM {s}.runs WHERE instance_id = %(id)s AND instance_id IS NOT NULL"
    "   ORDER BY created_at DESC, position DESC LIMIT 1)) AS f"
    " JOIN {s}.runs r USING (run_id) ORDER BY f.o LIMIT 1"
)


def start_keyed_run(
    conn: psycopg.Connection,
    q: Statements,
    statement: DirectStatement,
    run_id: str,
    created: ev.RunCreated,
    now: datetime,
    rule: StartRule,
) -> str:
    """The keyed start in ``conn``'s open transaction (see the module's docstring)."""
    instance_id = created.instance_id
    if instance_id is None:
        raise ValueError("a keyed start needs an instance_id")
    instances.hold(conn, q, instance_id)
    decision = decide(_latest(conn, q, instance_id, now), rule, created.workflow_name, now)
    if isinstance(decision, Debounce):
        # under the run's row lock, the run may have been given a task or begun meanwhile
        conn.execute(q("SELECT 1 FROM {s}.runs WHERE run_id = %s FOR NO KEY UPDATE"), [decision.run_id])
        decision = decide(_latest(conn, q, instance_id, now), rule, created.workflow_name, now)
    match decision:
        case Reuse(run_id=existing):
            return existing
        case Debounce(run_id=waiting, start_at=start_at):
            _debounce(conn, q, waiting, created, start_at)
            return waiting
        case Create(start_at=start_at):
            got = runs.create_run(conn, q, statement, run_id, created, now, public=True)[0]
            if got == run_id and start_at != now:
                _start_at(conn, q, run_id, start_at)
            return got


def _latest(conn: psycopg.Connection, q: Statements, instance_id: str, now: datetime) -> LatestRun | None:
    row = conn.execute(q(_LATEST), {"id": instance_id, "now": now}).fetchone()
    if row is None:
        return None
    run_id, workflow_name, status, created_at, waiting = row
    return LatestRun(
        run_id=run_id, workflow_name=workflow_name, status=RunStatus(status), created_at=created_at, waiting=waiting
    )


def _debounce(conn: psycopg.Connection, q: Statements, run_id: str, created: ev.RunCreated, start_at: datetime) -> None:
    """The waiting run takes the new start's arguments (its ``RunCreated`` keeps all else) and start time."""
    found = conn.execute(q("SELECT events FROM {s}.history WHERE run_id = %s AND first_seq = 1"), [run_id]).fetchone()
    if found is None:
        raise RuntimeError(f"run {run_id} has no first history block")
    (first,) = decode_block(found[0])
    old = first.event
    if not isinstance(old, ev.RunCreated):
        raise RuntimeError(f"run {run_id}'s history does not begin with RunCreated")
    _run, _first_seq, _last_seq, block = history_row(
        run_id, [attrs.evolve(first, event=attrs.evolve(old, input=created.input))]
    )
    conn.execute(q("UPDATE {s}.history SET events = %s WHERE run_id = %s AND first_seq = 1"), [block, run_id])
    _start_at(conn, q, run_id, start_at)


def _start_at(conn: psycopg.Connection, q: Statements, run_id: str, start_at: datetime) -> None:
    conn.execute(
        q("UPDATE {s}.inbox SET visible_from = %s WHERE run_id = %s AND kind = 'RunStarted'"), [start_at, run_id]
    )


class PostgresKeyedStarts:
    """:class:`dex.app.ports.instance_keys.KeyedStarts` on the adapter's connections, or in the
    application's transaction (``connection``)."""

    def __init__(self, db: Database, q: Statements, create_statement: DirectStatement, queues: PostgresQueues) -> None:
        self._db = db
        self._q = q
        self._create = create_statement
        self._queues = queues

    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        if connection is not None:
            conn = caller_connection(connection)
            self._queues.ensure_all([(created.queue, WORKFLOW)])
            return start_keyed_run(conn, self._q, self._create, run_id, created, now, rule)
        self._queues.ensure_all([(created.queue, WORKFLOW)])
        with refusals(), self._db.transaction() as conn:
            return start_keyed_run(conn, self._q, self._create, run_id, created, now, rule)
