"""The PostgreSQL adapter's update answers (:class:`dex.app.ports.updates.UpdateAnswers`).

Answers live in ``update_answers`` (migration 16), keyed by (run, update id); the completion
of a workflow task writes them and NOTIFYs in its own transaction
(:mod:`dex.adapters.postgres.update_answers`).

Callers of ``engine.update`` wait through one :class:`AnswerListener` per adapter: a thread
with a connection of its own (outside the pool, which must not lose a connection to a
``LISTEN`` that lasts) that wakes the waiters of the run a notification names. The listener is
started by the first wait and reconnects with a backoff if its connection is lost; each
reconnect wakes every waiter, which reads its answer again (a notification sent while nobody
listened is then not missed). Waiters also read again every few seconds, so a listener that
cannot connect at all makes answers slower, never lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import psycopg
from psycopg import sql

from dex.adapters.postgres import dispatch, workflow_tasks
from dex.adapters.postgres.connection import connect
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.refusals import refusals
from dex.adapters.postgres.runs import send_message
from dex.adapters.postgres.schema import LOCK_SCHEDULE_WORKFLOWS, TERMINAL, Statements
from dex.adapters.postgres.update_answers import answer_of
from dex.app.ports.store import Claim, Loaded, WorkflowTask
from dex.domain import events as ev
from dex.domain.task import UpdateAnswer
from dex.domain.writes import dropped_update_answers

log = logging.getLogger("dex.postgres.updates")


class AnswerListener:
    """A ``LISTEN`` on the answers' channel in a thread of its own, waking waiters by run id."""

    def __init__(self, conninfo: str, channel: str, *, first_connect: float = 2.0) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._first_connect = first_connect
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._closed = threading.Event()

    @contextmanager
    def waiting(self, run_id: str) -> Iterator[threading.Event]:
        """An event set whenever an answer for ``run_id`` may have been written (or the listener
        reconnected); registered before the caller reads, so no notification falls between."""
        woken = threading.Event()
        with self._lock:
            self._waiters.setdefault(run_id, set()).add(woken)
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._listen, name="dex-update-answers", daemon=True)
                self._thread.start()
        # the first wait of a process: let the LISTEN take effect before the caller reads
        self._listening.wait(self._first_connect)
        try:
            yield woken
        finally:
            with self._lock:
                waiters = self._waiters.get(run_id)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiters[run_id]

    def _wake(self, run_id: str | None) -> None:
        with self._lock:
            if run_id is None:
                events = [e for waiters in self._waiters.values() for e in waiters]
            else:
                events = list(self._waiters.get(run_id, ()))
        for event in events:
            event.set()

    def _listen(self) -> None:
        pause = 0.1
        while not self._closed.is_set():
            try:
                with connect(self._conninfo) as conn:
                    conn.autocommit = True
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._listening.set()
                    self._wake(None)  # whatever was answered while nobody listened: read again
                    pause = 0.1
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._wake(note.payload)
            except Exception as exc:  # noqa: BLE001 - the listener's connection failed: reconnect
                self._listening.clear()
                log.info("listening for update answers failed (%s); reconnecting", type(exc).__name__)
                self._wake(None)
                self._closed.wait(pause)
                pause = min(pause * 2, 5.0)

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening (idempotent); the thread ends within about half a second."""
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._wake(None)


class PostgresUpdates:
    """The update-answer ports of the PostgreSQL adapter."""

    def __init__(self, db: Database, q: Statements, listener: AnswerListener) -> None:
        self._db = db
        self._q = q
        self._listener = listener

    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        with refusals(), self._db.transaction() as conn:
            return self._request(conn, run_id, request, now)

    def request_update_then_claim(
        self, run_id: str, request: ev.UpdateRequested, now: datetime, claim: Claim
    ) -> tuple[UpdateAnswer | None, list[WorkflowTask], list[Loaded]]:
        q = self._q
        with refusals(), self._db.transaction() as conn:
            answer = self._request(conn, run_id, request, now)
            if answer is not None:
                return answer, [], []
            # the scheduler's rules for this run alone, under its lock if free (dispatch.py)
            dispatch.dispatch_now(conn, q, dispatch.of_runs([run_id]), LOCK_SCHEDULE_WORKFLOWS, now)
            claimed = workflow_tasks.claim_workflow_tasks(
                conn, q, claim.names, claim.owner, now, claim.lease, claim.limit
            )
            after = claim.after_seqs or {}
            requests = [(task, after.get(task.run_id, 0)) for task in claimed]
            loaded = workflow_tasks.load_workflow_tasks(conn, q, requests, now) if claimed else []
            return None, claimed, loaded

    def _request(
        self, conn: psycopg.Connection, run_id: str, request: ev.UpdateRequested, now: datetime
    ) -> UpdateAnswer | None:
        q = self._q
        row = conn.execute(
            q("SELECT result, failure, rejected FROM {s}.update_answers WHERE run_id = %s AND update_id = %s"),
            [run_id, request.update_id],
        ).fetchone()
        if row is not None and not row[2]:
            return answer_of(request.update_id, row)  # answered already: nothing runs again
        send_message(conn, q, run_id, request, now)  # locks the run FOR SHARE: ended runs refuse
        if row is not None:  # a rejection of this id: a new request replaces it
            conn.execute(
                q("DELETE FROM {s}.update_answers WHERE run_id = %s AND update_id = %s AND rejected"),
                [run_id, request.update_id],
            )
        return None

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        """The answer kept for ``update_id``; for a run that ended without one (its request was
        dropped with the run's inbox, or never reached it), the refusal a run's end gives."""
        with self._db.statement() as conn:
            row = conn.execute(
                self._q(
                    "SELECT a.result, a.failure, a.rejected, r.status IN " + TERMINAL + " FROM {s}.runs r"
                    " LEFT JOIN {s}.update_answers a ON a.run_id = r.run_id AND a.update_id = %s"
                    " WHERE r.run_id = %s"
                ),
                [update_id, run_id],
            ).fetchone()
        if row is None:
            return None
        result, failure, rejected, ended = row
        if rejected is None:  # no answer
            return dropped_update_answers([ev.UpdateRequested(update_id=update_id, name="")])[0] if ended else None
        return answer_of(update_id, (result, failure, rejected))

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        with self._listener.waiting(run_id) as woken:
            deadline = time.monotonic() + max(0.0, timeout)
            while True:
                answer = self.update_answer(run_id, update_id)
                left = deadline - time.monotonic()
                if answer is not None or left <= 0:
                    return answer
                woken.wait(left)
                woken.clear()
