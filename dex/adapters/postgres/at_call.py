"""The endings applied at the call, on PostgreSQL (docs/reference/contract.md §14):
``engine.terminate`` and the cancel of a run no engine can run, decided from the run's history
and inbox (:class:`~dex.app.ports.endings.RunEndings`), then written by the completion's own
:class:`~dex.adapters.postgres.completion.WriteRound`, as a workflow task's result is."""

from __future__ import annotations

from datetime import datetime

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.completion import LockedRun, WriteRound
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.schema import Statements
from dex.app.ports.endings import Decide
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage
from dex.domain.writes import INBOX_ORDER
from dex.serialization.history import decode_block, decode_message

_ATTEMPTS = 10  # an ending read, then written under the locks: tries while the run moves on


def end_run(db: Database, q: Statements, run_id: str, decide: Decide, now: datetime) -> bool:
    """``RunEndings.end_run``: the run read, its ending decided, then written under the locks of
    the run and of every run its messages go to (in run id order, as a completion takes them),
    if its history has not moved on meanwhile (else read again)."""
    for _ in range(_ATTEMPTS):
        with db.transaction() as conn:
            history, inbox = _load(conn, q, run_id, now)
            result = decide(history, inbox)
            if result is None:
                return False
            targets = sorted({run_id} | {m.run_id for m in result.messages})
            locked = conn.execute(
                q(
                    "SELECT run_id, status, last_seq FROM {s}.runs WHERE run_id = ANY(%b::text[])"
                    " ORDER BY run_id FOR NO KEY UPDATE"
                ),
                [arrays.texts(targets)],
            ).fetchall()
            runs = {r: LockedRun(RunStatus(status), last_seq) for r, status, last_seq in locked}
            run = runs.get(run_id)
            if run is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            if run.status.is_terminal:
                raise InvalidStateError(f"run {run_id} has ended ({run.status.value})")
            if run.last_seq != result.expected_last_seq:
                continue  # a workflow task wrote meanwhile: decide again from the new history
            # a worker's claim of the run's task is void: its result no longer matches the history
            conn.execute(q("DELETE FROM {s}.workflow_tasks WHERE run_id = %s"), [run_id])
            batch = WriteRound(conn, q, runs, now)
            batch.add(run_id, run, result)
            batch.flush()
            return True
    raise InvalidStateError(f"run {run_id} kept moving on while it was being ended; try again")


def _load(
    conn: psycopg.Connection, q: Statements, run_id: str, now: datetime
) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
    status = conn.execute(q("SELECT status FROM {s}.runs WHERE run_id = %s"), [run_id]).fetchone()
    if status is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    if RunStatus(status[0]).is_terminal:
        raise InvalidStateError(f"run {run_id} has ended ({status[0]})")
    blocks = conn.execute(q("SELECT events FROM {s}.history WHERE run_id = %s ORDER BY first_seq"), [run_id])
    history = [event for (data,) in blocks.fetchall() for event in decode_block(data)]
    order = ", ".join(INBOX_ORDER)
    messages = conn.execute(
        q("SELECT message_id, message FROM {s}.inbox WHERE run_id = %s AND visible_from <= %s ORDER BY " + order),
        [run_id, now],
    ).fetchall()
    return history, [InboxMessage(message_id=n, event=decode_message(data)) for n, data in messages]
