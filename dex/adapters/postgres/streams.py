"""Published values and streams in PostgreSQL (docs/reference/contract.md §14; tables of migration 18).

:func:`~.stream_writes.write_plans` writes what a batch of workflow tasks published and
streamed, inside the completion's transaction (:mod:`.completion`), after the batch locked its
runs; :class:`PostgresStreams` here is the :class:`~dex.app.ports.streams.StreamStore` port: the
reads, and the writes of activities.

Positions: an item's position is one more than the highest of its stream, computed by the
statement that inserts it, while the writer holds the run's row lock (``FOR NO KEY UPDATE``: the
completion takes it for its whole batch, an activity's write takes it first). So the writers of a
run's items take turns, their items commit in position order, and a reader asking for the items
after position n, through the primary key (run, key, position), never misses one that commits
later with a lower position. Reads take no lock; each is one statement, so the items, the
stream's closing and the run's status come from one snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dex.adapters.postgres import arrays
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.refusals import refusals
from dex.adapters.postgres.schema import Statements
from dex.adapters.postgres.stream_writes import insert_items
from dex.app.ports.streams import PublishedRead, RunStreams, StreamPage, StreamSummary
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.domain.values import Payload
from dex.serialization.values import decode_payload, encode_payload


class PostgresStreams:
    """The stream-store port of the PostgreSQL adapter."""

    def __init__(self, db: Database, q: Statements) -> None:
        self._db = db
        self._q = q

    def read_published(self, run_id: str, key: str) -> PublishedRead:
        with self._db.statement() as conn:
            row = conn.execute(
                self._q(
                    "SELECT r.status, p.value, p.version FROM {s}.runs r"
                    " LEFT JOIN {s}.published p ON p.run_id = r.run_id AND p.key = %s"
                    " WHERE r.run_id = %s"
                ),
                [key, run_id],
            ).fetchone()
        if row is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        status, value, version = row
        return PublishedRead(
            value=None if value is None else decode_payload(value),
            version=0 if version is None else int(version),
            run_status=RunStatus(status),
        )

    def read_stream(self, run_id: str, key: str, after: int, limit: int) -> StreamPage:
        after, limit = max(0, min(after, 2**62)), max(0, min(limit, 2**31))
        with self._db.statement() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT r.status,"
                    " EXISTS (SELECT 1 FROM {s}.closed_streams c WHERE c.run_id = r.run_id AND c.key = %(key)s),"
                    " i.position, i.value"
                    " FROM {s}.runs r LEFT JOIN LATERAL ("
                    "  SELECT position, value FROM {s}.stream_items"
                    "  WHERE run_id = r.run_id AND key = %(key)s AND position > %(after)s"
                    "  ORDER BY position LIMIT %(limit)s) i ON true"
                    " WHERE r.run_id = %(run_id)s ORDER BY i.position"
                ),
                {"run_id": run_id, "key": key, "after": after, "limit": limit},
            ).fetchall()
        if not rows:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        status, closed = rows[0][0], rows[0][1]
        items = tuple((int(position), decode_payload(value)) for _, _, position, value in rows if position is not None)
        return StreamPage(items=items, closed=bool(closed), run_status=RunStatus(status))

    def run_streams(self, run_id: str) -> RunStreams:
        with self._db.statement() as conn:
            published = conn.execute(
                self._q("SELECT key, value FROM {s}.published WHERE run_id = %s ORDER BY key"),
                [run_id],
            ).fetchall()
            streams = conn.execute(
                self._q(
                    "SELECT k.key, coalesce(max(i.position), 0), bool_or(c.key IS NOT NULL)"
                    " FROM (SELECT key FROM {s}.stream_items WHERE run_id = %(run_id)s"
                    "       UNION SELECT key FROM {s}.closed_streams WHERE run_id = %(run_id)s) k"
                    " LEFT JOIN {s}.stream_items i ON i.run_id = %(run_id)s AND i.key = k.key"
                    " LEFT JOIN {s}.closed_streams c ON c.run_id = %(run_id)s AND c.key = k.key"
                    " GROUP BY k.key ORDER BY k.key"
                ),
                {"run_id": run_id},
            ).fetchall()
        return RunStreams(
            published=tuple((key, decode_payload(value)) for key, value in published),
            streams=tuple(
                StreamSummary(key=key, length=int(length), closed=bool(closed)) for key, length, closed in streams
            ),
        )

    def write_stream_items(self, run_id: str, items: Sequence[tuple[str, Payload]], now: datetime) -> None:
        if not items:
            return
        encoded = [(run_id, key, encode_payload(value)) for key, value in items]
        with refusals(), self._db.transaction() as conn:
            # the run's row lock first, as the completion takes it: the writers of its items take turns
            run = conn.execute(
                self._q("SELECT status FROM {s}.runs WHERE run_id = %s FOR NO KEY UPDATE"), [run_id]
            ).fetchone()
            if run is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")
            if RunStatus(run[0]).is_terminal:
                raise InvalidStateError(
                    f"run {run_id} has ended ({run[0]}): nothing more can be written to its streams"
                )
            closed = conn.execute(
                self._q("SELECT key FROM {s}.closed_streams WHERE run_id = %s AND key = ANY(%b::text[]) LIMIT 1"),
                [run_id, arrays.texts(sorted({key for key, _ in items}))],
            ).fetchone()
            if closed is not None:
                raise ValueError(f"stream {closed[0]!r} is closed: nothing more can be written to it")
            insert_items(conn, self._q, encoded, now)
