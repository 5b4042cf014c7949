"""Workflow tasks: schedule them from visible inbox messages, claim them, load their input.

A run has at most one workflow task (``UNIQUE (run_id, queue)``). The scheduler creates it
when the run's inbox has a visible message, its queue is active and has room, and its
concurrency key (if any) is free; workers claim tasks with ``FOR UPDATE SKIP LOCKED`` and a
lease. Completing a task is :mod:`dex.adapters.postgres.completion`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.rows import WORKFLOW_TASK_COLUMNS, workflow_task
from dex.adapters.postgres.schema import LIVE, LOCK_SCHEDULE_WORKFLOWS, Statements
from dex.app.ports.store import Loaded, UnreadableHistoryError, WorkflowInput, WorkflowTask
from dex.domain import events as ev
from dex.domain.errors import RunNotFoundError
from dex.domain.task import InboxMessage
from dex.domain.values import FailureInfo
from dex.domain.writes import INBOX_ORDER, WAKING_KINDS
from dex.serialization.history import decode_block, decode_block_from, decode_message
from dex.serialization.values import encode_failure

# Candidates in the order the in-memory adapter takes them (priority, then oldest run:
# queue_limits.RUN_ORDER). Window functions stand in for its loop: per concurrency key only
# the runs it has grants for (queue_limits.key_grants, with the key's live holders counted
# everywhere, on the run's queue, and on other queues whose key concurrency is 1): on a queue
# with key concurrency 1, the key's first candidate if nobody holds it; on a queue with n > 1,
# its first n less its own holders, unless a queue with 1 holds the key or takes it in this
# round (the key's first candidate is on such a queue and nobody holds it); and per queue
# only as many runs as the queue has free slots. The operator's pause stops scheduling; a rate
# limit does not (it limits the claims: the generated ``paused`` column, migration 15).
# The key's windows and its holders' count are computed for the candidates that need a key
# only (``keyed``); the others join the granted ones in ``pool``, of which each queue with free
# slots takes its first ones, as many as it has slots, up to the limit (a LATERAL top-N per
# queue): a window over every waiting run ranked them all, a full sort of thousands of rows in
# each round (docs/decisions/key-concurrency-per-queue.md).
_CHOOSE = (
    """
    WITH visible AS (
        SELECT i.run_id, bool_or(i.kind = ANY(%(wakes)b::text[])) AS cancel
        FROM {s}.inbox i WHERE i.visible_from <= %(now)s GROUP BY i.run_id
    ),
    free AS (
        SELECT q.name AS queue, q.key_concurrency,
               q.capacity - (SELECT count(*) FROM {s}.workflow_tasks t WHERE t.queue = q.name) AS slots
        FROM {s}.queues q WHERE q.kind = 'workflow' AND NOT q.operator_paused
    ),
    candidates AS (
        SELECT r.run_id, r.workflow_name, r.queue, r.priority, r.created_at, r.position, r.concurrency_key,
               f.key_concurrency, (r.concurrency_key IS NOT NULL AND NOT r.holds_key AND NOT v.cancel) AS needs_key
        FROM visible v
        JOIN {s}.runs r ON r.run_id = v.run_id
        JOIN free f ON f.queue = r.queue AND f.slots > 0
        WHERE (r.status IN ('CREATED', 'RUNNING') OR (r.status = 'SUSPENDED' AND v.cancel))
          AND NOT EXISTS (SELECT 1 FROM {s}.workflow_tasks t WHERE t.run_id = r.run_id AND t.queue = r.queue)
    ),
    keyed AS (
        SELECT c.*,
               row_number() OVER (
                   PARTITION BY c.concurrency_key ORDER BY c.priority DESC, c.created_at, c.position
               ) AS key_rank,
               row_number() OVER (
                   PARTITION BY c.concurrency_key, c.queue ORDER BY c.priority DESC, c.created_at, c.position
               ) AS queue_key_rank,
               first_value(c.key_concurrency) OVER (
                   PARTITION BY c.concurrency_key ORDER BY c.priority DESC, c.created_at, c.position
               ) AS first_concurrency,
               h.everywhere, h.here, h.alone_elsewhere
        FROM candidates c
        CROSS JOIN LATERAL (
            SELECT count(*) AS everywhere, count(*) FILTER (WHERE hr.queue = c.queue) AS here,
                   count(*) FILTER (WHERE hr.queue <> c.queue AND coalesce(hq.key_concurrency, 1) = 1) AS alone_elsewhere
            FROM {s}.runs hr LEFT JOIN {s}.queues hq ON hq.kind = 'workflow' AND hq.name = hr.queue
            WHERE hr.holds_key AND hr.concurrency_key = c.concurrency_key AND hr.status IN """
    + LIVE
    + """
        ) h
        WHERE c.needs_key
    ),
    pool AS MATERIALIZED (
        SELECT c.run_id, c.workflow_name, c.queue, c.priority, c.created_at, c.position, c.needs_key
        FROM candidates c WHERE NOT c.needs_key
        UNION ALL
        SELECT k.run_id, k.workflow_name, k.queue, k.priority, k.created_at, k.position, k.needs_key
        FROM keyed k
        WHERE (k.key_concurrency = 1 AND k.everywhere = 0 AND k.key_rank = 1)
           OR (k.key_concurrency > 1 AND k.alone_elsewhere = 0 AND NOT (k.everywhere = 0 AND k.first_concurrency = 1)
               AND k.queue_key_rank + k.here <= k.key_concurrency)
    )
    SELECT r.run_id, r.workflow_name, r.queue, r.priority, r.needs_key
    FROM free f CROSS JOIN LATERAL (
        SELECT p.* FROM pool p WHERE p.queue = f.queue
        ORDER BY p.priority DESC, p.created_at, p.position
        LIMIT least(f.slots, %(limit)s)
    ) r
    WHERE f.slots > 0
    ORDER BY r.priority DESC, r.created_at, r.position
    LIMIT %(limit)s
    """
)


# the kinds of message that make a suspended run's task due (and need no concurrency key)
_WAKES = list(WAKING_KINDS)

# The loads' ORDER BY after the history part: the domain's inbox order. Each name must be a
# column of the inbox (and of the loads' output), which this lookup checks at import.
LOAD_ORDER = ", ".join({"visible_from": "visible_from", "message_id": "message_id"}[c] for c in INBOX_ORDER)


# the same choice among given runs only (a completion's dispatch)
_CHOOSE_OF_RUNS = _CHOOSE.replace(
    "FROM {s}.inbox i WHERE i.visible_from <= %(now)s GROUP BY i.run_id",
    "FROM {s}.inbox i WHERE i.visible_from <= %(now)s AND i.run_id = ANY(%(runs)b::text[]) GROUP BY i.run_id",
)
assert _CHOOSE_OF_RUNS != _CHOOSE

# a completion's dispatch as one statement, made only if its transaction took the scheduler's
# lock (the setting named %(gate)s says so: dispatch.dispatch_now); tasks are inserted in
# the choice's order, so their ids follow it as the scheduler's do
_LAST_SELECT = "SELECT r.run_id, r.workflow_name, r.queue, r.priority, r.needs_key\n    FROM free f"
_DISPATCH_OF_RUNS = (
    "INSERT INTO {s}.workflow_tasks (queue, run_id, workflow_name, priority)"
    " SELECT c.queue, c.run_id, c.workflow_name, c.priority FROM ("
    + _CHOOSE_OF_RUNS.replace(
        _LAST_SELECT, _LAST_SELECT.replace("r.needs_key", "r.needs_key, r.created_at, r.position")
    )
    + ") c WHERE NOT c.needs_key AND current_setting(%(gate)s, true) = 'true'"
    " ORDER BY c.priority DESC, c.created_at, c.position"
)
assert "r.created_at, r.position\n    FROM free f" in _DISPATCH_OF_RUNS


# The claim: FOR UPDATE SKIP LOCKED: rows another worker is claiming right now are passed over,
# not waited for, and do not count against the LIMIT; a row whose claim committed in between is
# re-checked against the lease condition and dropped. Each claim bumps lock_version, which is
# what a completion must still match. CLAIMED_QUEUES is the queues it takes from
# (rate_limits.py claims reserved rate-limited queues with the same statement).
CLAIMED_QUEUES = "t.queue IN (SELECT name FROM {s}.queues WHERE kind = 'workflow' AND NOT paused)"
CLAIM = (
    """
    WITH claimable AS (
        SELECT t.queue, t.task_id FROM {s}.workflow_tasks t
        WHERE t.workflow_name = ANY(%(names)b::text[])
          AND (t.locked_until IS NULL OR t.locked_until <= %(now)s)
          AND """
    + CLAIMED_QUEUES
    + """
        ORDER BY t.priority DESC, t.task_id
        LIMIT %(limit)s
        FOR UPDATE OF t SKIP LOCKED
    )
    UPDATE {s}.workflow_tasks t
    SET locked_by = %(owner)s, locked_until = %(until)s, lock_version = t.lock_version + 1
    FROM claimable c WHERE t.queue = c.queue AND t.task_id = c.task_id
    RETURNING """
    + ", ".join(f"t.{column.strip()}" for column in WORKFLOW_TASK_COLUMNS.split(","))
)


def schedule_workflow_tasks(conn: psycopg.Connection, q: Statements, now: datetime, limit: int) -> int:
    if limit <= 0:
        return 0
    # Only this transaction grants concurrency keys and queue slots until it commits: a second
    # scheduler (a leader that has not yet noticed it was replaced) waits here, then counts
    # again with a fresh snapshot.
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_SCHEDULE_WORKFLOWS, q.schema])
    chosen = conn.execute(q(_CHOOSE), {"now": now, "limit": limit, "wakes": _WAKES}).fetchall()
    if not chosen:
        return 0
    wanting_key = [run_id for run_id, _n, _q, _p, needs_key in chosen if needs_key]
    taken: set[str] = set()
    if wanting_key:
        # SKIP LOCKED: a run row held by a completion or a transition is left for the next
        # round instead of waiting on it, so the scheduler never takes part in a deadlock
        rows = conn.execute(
            q(
                "SELECT run_id FROM {s}.runs WHERE run_id = ANY(%b::text[]) AND status IN "
                + LIVE
                + " ORDER BY run_id FOR NO KEY UPDATE SKIP LOCKED"
            ),
            [wanting_key],
        ).fetchall()
        taken = {row[0] for row in rows}
        if taken:
            conn.execute(q("UPDATE {s}.runs SET holds_key = true WHERE run_id = ANY(%b::text[])"), [sorted(taken)])
    tasks = [row for row in chosen if not row[4] or row[0] in taken]
    if not tasks:
        return 0
    _insert_tasks(conn, q, tasks)
    return len(tasks)


def dispatch_workflow_tasks_of(
    conn: psycopg.Connection, q: Statements, now: datetime, run_ids: Sequence[str], gate: str
) -> None:
    """The scheduler's choice made among the given runs only (the runs a completion just sent
    messages to), for a completion's dispatch, and their tasks inserted: made only if the
    setting ``gate`` says that this transaction holds the scheduler's lock. Capacity, pause and
    suspension rules are the scheduler's own; concurrency keys are never granted here (a run
    that needs one waits for the scheduler, which compares it with every other run that wants
    the key), so only the key's holder, or a run without a key, is scheduled at once. One
    statement whose result is not read: in a pipeline it costs no round trip."""
    if not run_ids:
        return
    conn.execute(
        q(_DISPATCH_OF_RUNS),
        {"now": now, "limit": len(run_ids), "runs": sorted(set(run_ids)), "wakes": _WAKES, "gate": gate},
    )


def _insert_tasks(conn: psycopg.Connection, q: Statements, tasks: Sequence[Sequence[Any]]) -> None:
    run_ids, names, queues, priorities, _ = zip(*tasks, strict=True)
    # task ids follow the scheduling order, which is also the order of claims at equal priority
    conn.execute(
        q(
            "INSERT INTO {s}.workflow_tasks (queue, run_id, workflow_name, priority)"
            " SELECT t.queue, t.run_id, t.workflow_name, t.priority"
            " FROM unnest(%b::text[], %b::text[], %b::text[], %b::integer[]) WITH ORDINALITY"
            "  AS t(run_id, workflow_name, queue, priority, ord)"
            " ORDER BY t.ord"
        ),
        [list(run_ids), list(names), list(queues), list(priorities)],
    )


def claim_workflow_tasks(
    conn: psycopg.Connection,
    q: Statements,
    names: Collection[str],
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    statement: str = CLAIM,
    extra: Mapping[str, object] | None = None,
) -> list[WorkflowTask]:
    """Claim up to ``limit`` tasks, best first; ``statement`` and ``extra`` (its further
    parameters) are the rate limits' variants of :data:`CLAIM` (rate_limits.py)."""
    if not names or limit <= 0:
        return []
    params = {"names": sorted(names), "now": now, "limit": limit, "owner": owner, "until": now + lease}
    rows = conn.execute(q(statement), {**params, **extra} if extra else params).fetchall()
    rows.sort(key=lambda row: (-row[4], row[0]))
    return [workflow_task(row) for row in rows]


def retry_workflow_tasks(
    conn: psycopg.Connection,
    q: Statements,
    retries: Sequence[tuple[WorkflowTask, datetime]],
    failure: FailureInfo | None = None,
) -> list[bool]:
    """Give claimed tasks back, each claimable again from its time on (one statement); with
    ``failure``, the runs of the tasks given back keep it in ``task_failure`` (a held run).

    The row keeps its owner with ``locked_until`` moved to the retry time, so the claim's
    lease condition passes it over until then; ``lock_version`` moves on, so a late result of
    this claim no longer matches. Only rows still held at the claim's version change: the
    UPDATE's row lock waits for a concurrent completion or claim of the same row, then
    re-checks the version."""
    rows = conn.execute(
        q(
            "WITH given AS ("
            "UPDATE {s}.workflow_tasks t SET locked_until = r.retry_at, lock_version = t.lock_version + 1"
            " FROM unnest(%(queues)b::text[], %(ids)b::bigint[], %(owners)b::text[], %(versions)b::integer[],"
            " %(retry_at)b::timestamptz[]) AS r(queue, task_id, owner, version, retry_at)"
            " WHERE t.queue = r.queue AND t.task_id = r.task_id"
            " AND t.locked_by = r.owner AND t.lock_version = r.version"
            " RETURNING t.task_id, t.run_id),"
            # a held run says why (docs/reference/contract.md §11); the row lock is the one a status change takes
            # (runs.py: FOR NO KEY UPDATE), and only a run whose task we held is touched
            " held AS (UPDATE {s}.runs SET task_failure = %(failure)s FROM given"
            "  WHERE %(failure)s::bytea IS NOT NULL AND runs.run_id = given.run_id)"
            " SELECT task_id FROM given"
        ),
        {
            "queues": [task.queue for task, _ in retries],
            "ids": [task.task_id for task, _ in retries],
            "owners": [task.lease.owner for task, _ in retries],
            "versions": [task.lease.version for task, _ in retries],
            "retry_at": [retry_at for _, retry_at in retries],
            "failure": encode_failure(failure) if failure is not None else None,
        },
    ).fetchall()
    given_back = {row[0] for row in rows}
    return [task.task_id in given_back for task, _ in retries]


def load_workflow_task(
    conn: psycopg.Connection, q: Statements, task: WorkflowTask, now: datetime, after_seq: int = 0
) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
    """The run's history from ``after_seq`` on and its visible inbox, in one statement (one snapshot)."""
    rows = conn.execute(
        q(
            # history blocks (message_id: the last sequence number of each) ending at or after
            # after_seq, then the visible messages in the domain's order
            "SELECT 0 AS part, NULL::timestamptz AS visible_from, last_seq::bigint AS message_id, events AS data"
            " FROM {s}.history WHERE run_id = %(run)s AND last_seq >= %(after)s"
            " UNION ALL"
            " SELECT 1, visible_from, message_id, message FROM {s}.inbox"
            " WHERE run_id = %(run)s AND visible_from <= %(now)s"
            " ORDER BY part, " + LOAD_ORDER
        ),
        {"run": task.run_id, "now": now, "after": after_seq},
    ).fetchall()
    blocks = [(n, data) for part, _due, n, data in rows if part == 0]
    messages = [(n, data) for part, _due, n, data in rows if part == 1]
    if not blocks and task.run_id in _gone(conn, q, [(task, after_seq)]):
        raise RunNotFoundError(f"no run with id {task.run_id!r}")
    try:
        return _history_after(blocks, after_seq), _inbox(messages)
    except ValueError as exc:
        last_seq = blocks[-1][0] if blocks else after_seq
        raise UnreadableHistoryError(task.run_id, last_seq, [n for n, _data in messages], str(exc)) from exc


def _history_after(blocks: Sequence[tuple[int, bytes]], after_seq: int) -> list[ev.HistoryEvent]:
    """The events numbered ``after_seq`` or later in blocks (oldest first) that end there or
    later: of the first block (which may begin before it) only its tail is decoded."""
    if not blocks:
        return []
    (first_last, first), rest = blocks[0], blocks[1:]
    return decode_block_from(first, first_last, after_seq) + [
        event for _l, data in rest for event in decode_block(data)
    ]


def _inbox(messages: Sequence[tuple[int, bytes]]) -> list[InboxMessage]:
    return [InboxMessage(message_id=n, event=decode_message(data)) for n, data in messages]


def load_workflow_tasks(
    conn: psycopg.Connection, q: Statements, requests: Sequence[tuple[WorkflowTask, int]], now: datetime
) -> list[Loaded]:
    """:func:`load_workflow_task` for a claimed batch, in one statement (one snapshot, one round trip)."""
    if not requests:
        return []
    run_ids = [task.run_id for task, _after in requests]
    rows = conn.execute(
        q(
            # LATERAL: one index range scan per run, so the plan does not hang on the table's
            # statistics (a plain join of the batch may be planned as a hash join over it all)
            "SELECT 0 AS part, w.run_id, NULL::timestamptz AS visible_from, h.last_seq::bigint AS message_id,"
            " h.events AS data"
            " FROM unnest(%(runs)b::text[], %(after)b::integer[]) AS w(run_id, after_seq)"
            " CROSS JOIN LATERAL (SELECT last_seq, events FROM {s}.history"
            " WHERE run_id = w.run_id AND last_seq >= w.after_seq OFFSET 0) h"
            " UNION ALL"
            " SELECT 1, i.run_id, i.visible_from, i.message_id, i.message FROM {s}.inbox i"
            " WHERE i.run_id = ANY(%(runs)b::text[]) AND i.visible_from <= %(now)s"
            " ORDER BY run_id, part, " + LOAD_ORDER
        ),
        # packed (arrays.py): one array of each per task of a claimed round
        {"runs": arrays.texts(run_ids), "after": arrays.int4s([after for _task, after in requests]), "now": now},
    ).fetchall()
    return assemble_loaded(conn, q, requests, [(part, run_id, n, data) for part, run_id, _due, n, data in rows])


def assemble_loaded(
    conn: psycopg.Connection,
    q: Statements,
    requests: Sequence[tuple[WorkflowTask, int]],
    rows: Sequence[tuple[int, str, int, bytes]],
) -> list[Loaded]:
    """The inputs of a claimed batch from its load's rows (``part`` 0: a history block, ``n``
    its last sequence number; 1: a message, ``n`` its id), in the order of the load's
    ``ORDER BY``: per run, the blocks oldest first, then the messages in the inbox's order."""
    blocks: dict[str, list[tuple[int, bytes]]] = {}
    messages: dict[str, list[tuple[int, bytes]]] = {}
    for part, run_id, n, data in rows:
        (blocks if part == 0 else messages).setdefault(run_id, []).append((n, data))
    gone = _gone(conn, q, [(task, after) for task, after in requests if task.run_id not in blocks])
    loaded: list[Loaded] = []
    for task, after_seq in requests:
        run_blocks, run_messages = blocks.get(task.run_id, []), messages.get(task.run_id, [])
        if not run_blocks and task.run_id in gone:
            loaded.append(RunNotFoundError(f"no run with id {task.run_id!r}"))
            continue
        try:
            loaded.append(WorkflowInput(events=_history_after(run_blocks, after_seq), inbox=_inbox(run_messages)))
        except ValueError as exc:
            last_seq = run_blocks[-1][0] if run_blocks else after_seq
            loaded.append(UnreadableHistoryError(task.run_id, last_seq, [n for n, _d in run_messages], str(exc)))
    return loaded


def _gone(conn: psycopg.Connection, q: Statements, empty: Sequence[tuple[WorkflowTask, int]]) -> set[str]:
    """Of the runs whose load found no history, those that do not exist. Every run has
    RunCreated, so a load from the start that finds none is of a run that is gone; a tail
    (``after_seq`` > 0) comes back empty also when it asks past the run's last event (an
    executor that stood on a result the store refused), so only then is the run looked up:
    a rare second statement, never on the way of a run that moves on."""
    gone = {task.run_id for task, after_seq in empty if after_seq == 0}
    tails = sorted({task.run_id for task, after_seq in empty if after_seq > 0} - gone)
    if tails:
        found = conn.execute(q("SELECT run_id FROM {s}.runs WHERE run_id = ANY(%b::text[])"), [tails]).fetchall()
        gone.update(set(tails) - {row[0] for row in found})
    return gone
