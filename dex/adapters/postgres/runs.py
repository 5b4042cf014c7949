"""Runs: create, read, list, message and transition them, and delete finished ones.

Each function runs inside the caller's transaction (or is one statement of its own). Row
locks on ``runs`` follow one rule throughout the adapter: whoever changes a run's status or
history holds its row ``FOR NO KEY UPDATE``; whoever only puts a message in its inbox holds
it ``FOR SHARE``. The two conflict, so a message can never slip into the inbox of a run that
is ending in a concurrent transaction (the inserter waits, then sees the run has ended). The
one exception is a message sent in the application's own transaction (:func:`send_message`).
The tables hold no foreign keys (migration 3): these locks are what keep a run's rows with it.

:class:`PostgresRuns` is the adapter's part that runs these functions on its connections.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from datetime import datetime

import attrs
import psycopg
from psycopg import sql

from dex.adapters.postgres import direct, endings
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.direct import BOOL, BYTEA, INT4, JSONB, TEXT, TEXT_ARRAY, TIMESTAMPTZ
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.refusals import batch_refusals
from dex.adapters.postgres.rows import (
    RUN_COLUMNS,
    history_row,
    inbox_row,
    insert_inbox,
    labels_json,
    run_record,
)
from dex.adapters.postgres.schema import LIVE, LOCK_SCHEDULE_WORKFLOWS, TERMINAL, Statements
from dex.app.ports.store import (
    WORKFLOW,
    Claim,
    Lease,
    Loaded,
    RunFilter,
    RunRecord,
    StepEndings,
    WorkflowInput,
    WorkflowTask,
)
from dex.domain import events as ev
from dex.domain.errors import DexError, InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus, requested
from dex.domain.task import InboxMessage
from dex.serialization.history import decode_block, step_endings_in_block


@attrs.frozen(kw_only=True)
class NewRunRow:
    """The arguments of the schema's ``create_run`` function (migration 4) for one start, by
    name: the run's row, its first history block and inbox message, and the claim of its
    first workflow task (``claim`` false: none; then ``owner``, ``lease_until`` and
    ``workflow_names`` are None)."""

    run_id: str
    workflow_name: str
    queue: str
    instance_id: str | None
    priority: int
    concurrency_key: str | None
    labels: str  # a JSON object of string pairs (direct.jsonb_object)
    parent_run_id: str | None
    created_at: datetime
    history: bytes  # the history block of [RunCreated]
    message_kind: str
    message: bytes  # the encoded RunStarted
    claim: bool
    owner: str | None
    lease_until: datetime | None
    workflow_names: list[str] | None  # the workflows the claim takes, sorted
    lock: int  # the scheduler's advisory lock, tried before the claim
    schema: str
    code_version: str | None  # the starting engine's (migration 7)

    def params(self) -> list[object]:
        """The values in the order of the function's parameters (:data:`PARAMETERS`)."""
        return list(_IN_ORDER(self))


# the create_run function's parameters, in order (schema migration 7): the NewRunRow field that
# holds each, its type, and its name in errors (a NUL refused in it)
PARAMETERS = (
    ("run_id", TEXT, "run_id"),
    ("workflow_name", TEXT, "workflow_name"),
    ("queue", TEXT, "queue"),
    ("instance_id", TEXT, "instance_id"),
    ("priority", INT4, "priority"),
    ("concurrency_key", TEXT, "concurrency_key"),
    ("labels", JSONB, "labels"),
    ("parent_run_id", TEXT, "parent_run_id"),
    ("created_at", TIMESTAMPTZ, "created_at"),
    ("history", BYTEA, "history"),
    ("message_kind", TEXT, "message kind"),
    ("message", BYTEA, "message"),
    ("claim", BOOL, "claim"),
    ("owner", TEXT, "owner"),
    ("lease_until", TIMESTAMPTZ, "lease until"),
    ("workflow_names", TEXT_ARRAY, "workflow names"),
    ("lock", INT4, "lock"),
    ("schema", TEXT, "schema"),
    ("code_version", TEXT, "code_version"),
)
_IN_ORDER = operator.attrgetter(*(field for field, _type, _name in PARAMETERS))


def create_run_statement(q: Statements) -> direct.DirectStatement:
    """The start's one statement (see :func:`create_run`), for one adapter's schema."""
    placeholders = ", ".join(f"${n}" for n in range(1, len(PARAMETERS) + 1))
    return direct.DirectStatement(
        "dex_create_run",
        q("SELECT out_run, out_message, out_task FROM {s}.create_run(" + placeholders + ")"),
        [oid for _field, oid, _name in PARAMETERS],
        [name for _field, _oid, name in PARAMETERS],
    )


def create_run(
    conn: psycopg.Connection,
    q: Statements,
    statement: direct.DirectStatement,
    run_id: str,
    created: ev.RunCreated,
    now: datetime,
    claim: Claim | None = None,
    *,
    public: bool = False,
) -> tuple[str, list[WorkflowTask], list[Loaded]]:
    """Insert a run with history ``[RunCreated]`` and inbox ``[RunStarted]``, or return the id
    of the live run that already has this instance id.

    One statement (the history and inbox rows are inserted by data-modifying CTEs from the
    runs row the first one returned), so it is atomic on its own and costs one round trip; it
    lives in the schema's ``create_run`` function (migration 4), which keeps its plan cached,
    and goes through libpq directly (``statement``, :mod:`.direct`, on the psycopg versions
    it was checked against, unless ``public``: psycopg's ``execute`` otherwise, as for an
    application's own connection): it is the statement an
    application's loop of starts waits for, once per run.
    With ``claim``, a further CTE inserts the run's first workflow task already claimed for
    ``claim.owner`` when the scheduler would create it at once anyway: no concurrency key,
    the queue active with a free slot, and the scheduler's lock free (tried, never waited
    for, as in a completion's dispatch; while a scheduler runs, it counts the slots).
    """
    history = [ev.HistoryEvent(sequence_number=1, timestamp=now, event=created)]
    _run, _first, _last, block = history_row(run_id, history)
    _run, kind, message, _visible = inbox_row(run_id, ev.RunStarted(), now)
    row = NewRunRow(
        run_id=run_id,
        workflow_name=created.workflow_name,
        queue=created.queue,
        instance_id=created.instance_id,
        priority=created.priority,
        concurrency_key=created.concurrency_key,
        labels=direct.jsonb_object(created.labels, "labels").decode(),
        parent_run_id=created.parent_run_id,
        created_at=now,
        history=block,
        message_kind=kind,
        message=message,
        claim=claim is not None,
        owner=claim.owner if claim is not None else None,
        lease_until=now + claim.lease if claim is not None else None,
        workflow_names=sorted(claim.names) if claim is not None else None,
        lock=LOCK_SCHEDULE_WORKFLOWS,
        schema=q.schema,
        code_version=created.code_version,
    )
    for _ in range(10):
        try:
            ids = _call_create_run(conn, q, statement, row, public)
        except psycopg.errors.UniqueViolation:
            raise ValueError(f"run {run_id} exists already") from None
        if ids is not None:
            message_id, task_id = ids
            if created.deadline is not None:  # in the start's transaction (PostgresRuns makes one)
                endings.write_deadline(conn, q, run_id, created)
            if claim is None or task_id is None:
                return run_id, [], []
            # the claimed task is what was just inserted: no load needed, and its fields are
            # the values sent (the function returns the ids the server made)
            assert row.owner is not None and row.lease_until is not None and message_id is not None
            task = WorkflowTask(
                task_id=int(task_id),
                run_id=run_id,
                workflow_name=created.workflow_name,
                queue=created.queue,
                lease=Lease(owner=row.owner, until=row.lease_until, version=1),
            )
            inbox = [InboxMessage(message_id=int(message_id), event=ev.RunStarted())]
            return run_id, [task], [WorkflowInput(events=history, inbox=inbox)]
        existing = conn.execute(
            q("SELECT run_id FROM {s}.runs WHERE instance_id = %s AND status IN " + LIVE),
            [created.instance_id],
        ).fetchone()
        if existing is not None:
            return str(existing[0]), [], []
        # the clashing run ended between our insert and our select: try again
    raise InvalidStateError(f"instance id {created.instance_id!r} is contended; try again")


def _call_create_run(
    conn: psycopg.Connection,
    q: Statements,
    statement: direct.DirectStatement,
    row: NewRunRow,
    public: bool = False,
) -> tuple[str | None, str | None] | None:
    """The ``create_run`` function's message and task ids (None when the instance id clashed):
    through libpq (:mod:`.direct`) where the installed psycopg is one it was checked against,
    else through psycopg's ``execute``, prepared, the values adapted by psycopg."""
    params = row.params()
    encoded = statement.encode(params)
    if direct.AVAILABLE and not public:
        result = statement.execute(conn, encoded)
        return (direct.value(result, 1), direct.value(result, 2)) if result.ntuples else None
    statement.check(encoded)  # the same refusals (a NUL named by its field) on either path
    got = conn.execute(q(_CREATE_RUN), params, prepare=True).fetchone()
    return (_text(got[1]), _text(got[2])) if got is not None else None


# the public path's statement: each parameter cast to the type the function takes (the array
# in binary, by the adapter's rule: arrays.py)
_CREATE_RUN = (
    "SELECT out_run, out_message, out_task FROM {s}.create_run(%s::text, %s::text, %s::text, %s::text,"
    " %s::int4, %s::text, %s::jsonb, %s::text, %s::timestamptz, %s::bytea, %s::text, %s::bytea, %s::bool,"
    " %s::text, %s::timestamptz, %b::text[], %s::int4, %s::text, %s::text)"
)


def _text(value: object) -> str | None:
    return str(value) if value is not None else None


def get_run(conn: psycopg.Connection, q: Statements, run_id: str) -> RunRecord | None:
    row = conn.execute(q("SELECT " + RUN_COLUMNS + " FROM {s}.runs WHERE run_id = %s"), [run_id]).fetchone()
    return run_record(row) if row is not None else None


def get_runs(conn: psycopg.Connection, q: Statements, run_ids: Sequence[str]) -> list[RunRecord]:
    """The runs among ``run_ids`` that exist (one index lookup each, one round trip)."""
    rows = conn.execute(
        q("SELECT " + RUN_COLUMNS + " FROM {s}.runs WHERE run_id = ANY(%b::text[])"), [list(dict.fromkeys(run_ids))]
    ).fetchall()
    return [run_record(row) for row in rows]


def list_runs(conn: psycopg.Connection, q: Statements, run_filter: RunFilter) -> list[RunRecord]:
    """Runs matching the filter, newest first (created_at, then creation order, descending)."""
    conditions: list[sql.Composable] = []
    params: list[object] = []
    if run_filter.workflow_name is not None:
        conditions.append(sql.SQL("workflow_name = %s"))
        params.append(run_filter.workflow_name)
    if run_filter.statuses is not None:
        conditions.append(sql.SQL("status = ANY(%b::text[])"))
        params.append([status.value for status in run_filter.statuses])
    if run_filter.instance_id is not None:
        conditions.append(sql.SQL("instance_id = %s"))
        params.append(run_filter.instance_id)
    if run_filter.code_version is not None:
        conditions.append(sql.SQL("code_version = %s"))
        params.append(run_filter.code_version)
    if run_filter.parent_run_id is not None:
        conditions.append(sql.SQL("parent_run_id = %s"))  # served by the index runs_children
        params.append(run_filter.parent_run_id)
    if run_filter.top_level:
        conditions.append(sql.SQL("parent_run_id IS NULL"))
    if run_filter.created_after is not None:
        conditions.append(sql.SQL("created_at > %s"))
        params.append(run_filter.created_after)
    if run_filter.created_before is not None:
        conditions.append(sql.SQL("created_at < %s"))
        params.append(run_filter.created_before)
    if run_filter.labels:
        conditions.append(sql.SQL("labels @> %s"))  # served by the GIN index runs_labels
        params.append(labels_json(run_filter.labels))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    query = sql.Composed(
        [
            q.composed("SELECT " + RUN_COLUMNS + " FROM {s}.runs"),
            where,
            sql.SQL(" ORDER BY created_at DESC, position DESC LIMIT %s"),
        ]
    )
    params.append(run_filter.limit)
    return [run_record(row) for row in conn.execute(query, params).fetchall()]


def load_history(conn: psycopg.Connection, q: Statements, run_id: str) -> list[bytes]:
    """The history blocks of a run, oldest first; RunNotFoundError if there is no such run."""
    rows = conn.execute(q("SELECT events FROM {s}.history WHERE run_id = %s ORDER BY first_seq"), [run_id]).fetchall()
    if not rows:  # every run has at least RunCreated
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return [row[0] for row in rows]


def load_history_after(conn: psycopg.Connection, q: Statements, run_id: str, after_seq: int, limit: int) -> list[bytes]:
    """The blocks holding the run's ``limit`` events after ``after_seq`` (and the rest of the
    first and last block), oldest first. The stored history is one generation of consecutive
    sequence numbers, so the blocks wanted run from the one holding ``after_seq + 1`` (the
    first, if that lies before it) to the one holding the event ``limit`` past the later of
    ``after_seq`` and the number before the first stored one: both ends found on the primary
    key ``(run_id, first_seq)``, so a page far into a long history reads only its blocks."""
    rows = conn.execute(
        q(
            "SELECT events FROM {s}.history WHERE run_id = %(run)s AND last_seq > %(after)s"
            " AND first_seq >= COALESCE((SELECT b.first_seq FROM {s}.history b"
            "  WHERE b.run_id = %(run)s AND b.first_seq <= %(after)s + 1 ORDER BY b.first_seq DESC LIMIT 1), 0)"
            " AND first_seq <= GREATEST(%(after)s, (SELECT f.first_seq - 1 FROM {s}.history f"
            "  WHERE f.run_id = %(run)s ORDER BY f.first_seq LIMIT 1)) + %(limit)s"
            " ORDER BY first_seq"
        ),
        {"run": run_id, "after": after_seq, "limit": limit},
    ).fetchall()
    if not rows and conn.execute(q("SELECT 1 FROM {s}.runs WHERE run_id = %s"), [run_id]).fetchone() is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return [row[0] for row in rows]


def history_bounds(conn: psycopg.Connection, q: Statements, run_id: str) -> tuple[int, int]:
    """The first and last sequence numbers of the run's history: its first and last block, each
    found on the primary key ``(run_id, first_seq)``."""
    row = conn.execute(
        q(
            "SELECT (SELECT first_seq FROM {s}.history WHERE run_id = %(run)s ORDER BY first_seq LIMIT 1),"
            " (SELECT last_seq FROM {s}.history WHERE run_id = %(run)s ORDER BY first_seq DESC LIMIT 1)"
        ),
        {"run": run_id},
    ).fetchone()
    if row is None or row[0] is None:  # every run has at least RunCreated
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return int(row[0]), int(row[1])


def _live_status(conn: psycopg.Connection, q: Statements, run_id: str, lock: str) -> RunStatus:
    row = conn.execute(q("SELECT status FROM {s}.runs WHERE run_id = %s " + lock), [run_id]).fetchone()
    if row is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    status = RunStatus(row[0])
    if status.is_terminal:
        raise InvalidStateError(f"run {run_id} has ended ({status.value})")
    return status


def send_message(
    conn: psycopg.Connection, q: Statements, run_id: str, message: ev.Message, now: datetime, *, in_caller: bool = False
) -> None:
    """Put ``message`` in the inbox of the live run ``run_id``.

    On the adapter's own connection the run is locked ``FOR SHARE`` for the statement's
    moment: it waits for a completion that is ending the run, then sees it ended. In the
    application's transaction (``in_caller``: ``send_event(connection=...)``), which may stay
    open for as long as the application likes, the lock is ``FOR KEY SHARE``: it keeps
    retention off the run but lets the engine's completions lock it, so an open transaction
    holds back no write of the engine (``FOR SHARE`` held the whole flush of every run written
    with this one). A run that ends before that transaction commits then ends without the
    message, as it ends without any message it has not read; the message row stays with the
    ended run until retention deletes both, and no scheduler looks at an ended run's inbox."""
    _live_status(conn, q, run_id, "FOR KEY SHARE" if in_caller else "FOR SHARE")
    insert_inbox(conn, q, [inbox_row(run_id, message, now)])


def send_messages(
    conn: psycopg.Connection, q: Statements, items: list[tuple[str, ev.Message]], now: datetime
) -> list[DexError | None]:
    """A batch of ``send_message``: one status read, one insert; per item None or its error."""
    run_ids = sorted({run_id for run_id, _ in items})
    # FOR SHARE, in run id order like every other locker: waits for completions ending these runs
    rows = conn.execute(
        q("SELECT run_id, status FROM {s}.runs WHERE run_id = ANY(%b::text[]) ORDER BY run_id FOR SHARE"), [run_ids]
    ).fetchall()
    statuses = {run_id: RunStatus(status) for run_id, status in rows}
    errors: list[DexError | None] = []
    accepted = []
    for run_id, message in items:
        status = statuses.get(run_id)
        if status is None:
            errors.append(RunNotFoundError(f"no run with id {run_id!r}"))
        elif status.is_terminal:
            errors.append(InvalidStateError(f"run {run_id} has ended ({status.value})"))
        else:
            errors.append(None)
            accepted.append(inbox_row(run_id, message, now))
    if accepted:
        insert_inbox(conn, q, accepted)
    return errors


def request_transition(
    conn: psycopg.Connection, q: Statements, run_id: str, target: RunStatus, message: ev.Message, now: datetime
) -> None:
    # FOR NO KEY UPDATE: the status check and the change are one step against other transitions
    status = _live_status(conn, q, run_id, "FOR NO KEY UPDATE")
    requested(status, target)
    if target is not RunStatus.CANCELLED:
        conn.execute(q("UPDATE {s}.runs SET status = %s WHERE run_id = %s"), [target.value, run_id])
    else:
        pending = conn.execute(
            q("SELECT 1 FROM {s}.inbox WHERE run_id = %s AND kind = 'RunCancelled' AND visible_from <= %s LIMIT 1"),
            [run_id, now],
        ).fetchone()
        if pending is not None:
            return  # a cancel is already on its way (a deadline's, waiting for its time, is not)
    insert_inbox(conn, q, [inbox_row(run_id, message, now)])


def delete_finished_runs(conn: psycopg.Connection, q: Statements, completed_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` ended runs with their history, inbox, tasks, steps' attempts,
    published values and streams, in one statement."""
    # SKIP LOCKED: a run row locked by someone (a late message checking it) is left for next time.
    # The run rows are locked first, then the rows that belong to them (the adapter's lock order);
    # nothing is added to an ended run, so nothing of it can appear after this statement's snapshot.
    deleted = conn.execute(
        q(
            "WITH gone AS ("
            " DELETE FROM {s}.runs WHERE run_id IN ("
            "  SELECT run_id FROM {s}.runs"
            "  WHERE status IN " + TERMINAL + " AND completed_at < %s"
            "  ORDER BY completed_at LIMIT %s FOR UPDATE SKIP LOCKED)"
            " RETURNING run_id),"
            " h AS (DELETE FROM {s}.history WHERE run_id IN (SELECT run_id FROM gone)),"
            " i AS (DELETE FROM {s}.inbox WHERE run_id IN (SELECT run_id FROM gone)),"
            " w AS (DELETE FROM {s}.workflow_tasks WHERE run_id IN (SELECT run_id FROM gone)),"
            " a AS (DELETE FROM {s}.activity_tasks WHERE run_id IN (SELECT run_id FROM gone)),"
            " f AS (DELETE FROM {s}.activity_attempts WHERE run_id IN (SELECT run_id FROM gone)),"
            " u AS (DELETE FROM {s}.update_answers WHERE run_id IN (SELECT run_id FROM gone)),"
            " p AS (DELETE FROM {s}.published WHERE run_id IN (SELECT run_id FROM gone)),"
            " si AS (DELETE FROM {s}.stream_items WHERE run_id IN (SELECT run_id FROM gone)),"
            " cs AS (DELETE FROM {s}.closed_streams WHERE run_id IN (SELECT run_id FROM gone))"
            " SELECT count(*) FROM gone"
        ),
        [completed_before, limit],
    ).fetchone()
    return int(deleted[0]) if deleted is not None else 0


class PostgresRuns:
    """The run-store ports of the PostgreSQL adapter: starts, reads of runs and histories,
    messages, status requests and the retention of finished runs."""

    def __init__(
        self, db: Database, q: Statements, create_statement: direct.DirectStatement, queues: PostgresQueues
    ) -> None:
        self._db = db
        self._q = q
        self._create = create_statement
        self._queues = queues

    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        self._queues.ensure_all([(created.queue, WORKFLOW)])
        if created.deadline is not None:  # the run, its deadline and its cancel request: one transaction
            with self._db.transaction() as conn:
                return create_run(conn, self._q, self._create, run_id, created, now, public=True)[0]
        with self._db.statement(kept=True) as conn:  # one statement per attempt; see create_run
            return create_run(conn, self._q, self._create, run_id, created, now)[0]

    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        self._queues.ensure_all([(created.queue, WORKFLOW)])
        if created.deadline is not None:
            with self._db.transaction() as conn:
                return create_run(conn, self._q, self._create, run_id, created, now, claim, public=True)
        with self._db.statement(kept=True) as conn:
            return create_run(conn, self._q, self._create, run_id, created, now, claim)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._db.statement() as conn:
            return get_run(conn, self._q, run_id)

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        if not run_ids:
            return []
        with self._db.statement() as conn:
            return get_runs(conn, self._q, run_ids)

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        with self._db.statement() as conn:
            return list_runs(conn, self._q, run_filter)

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        with self._db.statement() as conn:
            encoded = load_history(conn, self._q, run_id)
        return [event for data in encoded for event in decode_block(data)]

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        if limit <= 0:
            return []
        after_seq, limit = max(-1, min(after_seq, 2**62)), min(limit, 2**31)  # no sum leaves a bigint
        with self._db.statement() as conn:
            encoded = load_history_after(conn, self._q, run_id, after_seq, limit)
        events = (event for data in encoded for event in decode_block(data))
        return [event for event in events if event.sequence_number > after_seq][:limit]

    def history_bounds(self, run_id: str) -> tuple[int, int]:
        with self._db.statement() as conn:
            return history_bounds(conn, self._q, run_id)

    def step_endings(self, run_id: str, created_seqs: Collection[int], after_seq: int, limit: int) -> StepEndings:
        """One read of the blocks that hold the ``limit`` events after ``after_seq`` (the
        history is stored as blocks of events, indexed by their sequence numbers only, so a
        step's outcome is found by reading the events after it); of those events only the
        outcomes sought become domain events."""
        wanted = frozenset(created_seqs)
        if not wanted or limit <= 0:
            return StepEndings(complete=not wanted)
        after_seq, limit = max(-1, min(after_seq, 2**62)), min(limit, 2**31)
        try:
            with self._db.statement() as conn:
                encoded = load_history_after(conn, self._q, run_id, after_seq, limit)
        except RunNotFoundError:
            return StepEndings()
        found: list[ev.HistoryEvent] = []
        read = 0
        for data in encoded:
            endings, counted = step_endings_in_block(data, wanted, after_seq, limit - read)
            found.extend(endings)
            read += counted
        return StepEndings(events=tuple(found), complete=read < limit or len(found) == len(wanted))

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        with self._db.transaction() as conn:
            send_message(conn, self._q, run_id, message, now)

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        with batch_refusals(), self._db.transaction() as conn:
            return send_messages(conn, self._q, list(items), now)

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        with self._db.transaction() as conn:
            request_transition(conn, self._q, run_id, target, message, now)

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        with self._db.transaction() as conn:
            return delete_finished_runs(conn, self._q, completed_before, limit)
