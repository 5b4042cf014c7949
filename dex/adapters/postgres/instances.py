"""Instance ids claimed by starts still in flight in the application's transactions.

``start_workflow(..., instance_id=X, connection=conn)`` inserts the run in the application's
transaction, which may stay open as long as the application likes. Until it ends, another
insert of a live run with instance id X waits for it (the partial unique index
``runs_live_instance`` decides clashes, and a clash with an uncommitted row waits for its
transaction). When that other insert is a child run in the engine's completion, the whole
flush waited, every run in it and every flush behind it: one open transaction stalled the
engine's workflow writes.

So such a start first takes a transaction-scoped advisory lock on its instance id
(:func:`hold`), and a completion that starts children with instance ids only *tries* those
locks (:func:`send_tries`, in its pipeline with its other locks). A child whose instance id
is held is not inserted: its result is not applied, its task's messages stay in the inbox,
and the scheduler gives the run a new task, which tries again, until the application's
transaction has ended and the clash (or no clash) is plain. Only that run waits. The engine's
own starts (autocommit, a statement long) take no lock: a completion waits for them as long
as their statement takes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import LOCK_INSTANCE, Statements


def hold(conn: Any, q: Statements, instance_id: str) -> None:
    """Lock ``instance_id`` until the end of ``conn``'s transaction (waits for a completion
    that is trying it at this moment: a statement long)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_INSTANCE, _key(q, instance_id)])


def send_tries(conn: psycopg.Connection, q: Statements, instance_ids: Collection[str]) -> psycopg.Cursor[Any]:
    """Try the locks of ``instance_ids`` (held until the transaction ends, never waited for);
    the answer, read by :func:`held_elsewhere`, names those another transaction holds."""
    keys = sorted(set(instance_ids))
    return conn.execute(
        "SELECT k.id FROM unnest(%b::text[], %b::text[]) AS k(id, key)"
        " WHERE NOT pg_try_advisory_xact_lock(%s, hashtext(k.key))",
        [arrays.texts(keys), arrays.texts([_key(q, key) for key in keys]), LOCK_INSTANCE],
    )


def held_elsewhere(sent: psycopg.Cursor[Any] | None) -> set[str]:
    return {row[0] for row in sent.fetchall()} if sent is not None else set()


def _key(q: Statements, instance_id: str) -> str:
    return f"{q.schema}:{instance_id}"
