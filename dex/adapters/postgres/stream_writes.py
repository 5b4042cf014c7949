"""The writes of published values and stream items (docs/reference/contract.md §14; migration 18).

:func:`write_plans` runs inside the completion's transaction (:mod:`.completion`), after the batch
locked its runs ``FOR NO KEY UPDATE``; :func:`insert_items` also serves activities' writes
(:mod:`.streams`), which take the run's row lock first. An item's position is one more than the
highest of its stream, computed by the statement that inserts it under that lock, so a run's
items commit in position order (see :mod:`.streams`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import Statements
from dex.domain.values import Payload
from dex.domain.writes import WritePlan
from dex.serialization.values import encode_payload

# an item goes after the last of its stream; items of one statement in their order (ord)
_INSERT_ITEMS = (
    "INSERT INTO {s}.stream_items (run_id, key, position, value, written_at)"
    " SELECT i.run_id, i.key,"
    "  coalesce((SELECT max(x.position) FROM {s}.stream_items x WHERE x.run_id = i.run_id AND x.key = i.key), 0)"
    "  + row_number() OVER (PARTITION BY i.run_id, i.key ORDER BY i.ord),"
    "  i.value, %s"
    " FROM unnest(%b::text[], %b::text[], %b::bytea[]) WITH ORDINALITY AS i(run_id, key, value, ord)"
    " WHERE NOT EXISTS (SELECT 1 FROM {s}.closed_streams c WHERE c.run_id = i.run_id AND c.key = i.key)"
)


def write_plans(conn: psycopg.Connection, q: Statements, plans: Sequence[tuple[str, WritePlan]], now: datetime) -> None:
    """Write the published values, stream items and closes of ``plans`` (one per run; the caller
    holds the runs' row locks and writes their history blocks in the same transaction). An item
    for a stream that is closed already (written by a later generation of a run that continued
    as new) is not kept: a closed stream stays closed for its readers."""
    latest: dict[tuple[str, str], tuple[Payload, int]] = {}
    items: list[tuple[str, str, bytes]] = []
    closes: list[tuple[str, str]] = []
    for run_id, plan in plans:
        for key, value in plan.published:
            known = latest.get((run_id, key))
            latest[(run_id, key)] = (value, 1 if known is None else known[1] + 1)
        items.extend((run_id, item.key, encode_payload(item.value)) for item in plan.stream_items)
        closes.extend((run_id, key) for key in plan.streams_closed)
    if latest:
        # one row per (run, key), as ON CONFLICT DO UPDATE allows; version counts every publish
        conn.execute(
            q(
                "INSERT INTO {s}.published (run_id, key, value, version, published_at)"
                " SELECT p.run_id, p.key, p.value, p.times, %s"
                " FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::bigint[]) AS p(run_id, key, value, times)"
                " ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value,"
                "  version = {s}.published.version + excluded.version, published_at = excluded.published_at"
            ),
            [
                now,
                arrays.texts([run_id for run_id, _ in latest]),
                arrays.texts([key for _, key in latest]),
                arrays.byteas([encode_payload(value) for value, _ in latest.values()]),
                arrays.int8s([times for _, times in latest.values()]),
            ],
        )
    if items:
        insert_items(conn, q, items, now)
    if closes:
        conn.execute(
            q(
                "INSERT INTO {s}.closed_streams (run_id, key, closed_at)"
                " SELECT c.run_id, c.key, %s FROM unnest(%b::text[], %b::text[]) AS c(run_id, key)"
                " ON CONFLICT DO NOTHING"
            ),
            [now, arrays.texts([run_id for run_id, _ in closes]), arrays.texts([key for _, key in closes])],
        )


def insert_items(
    conn: psycopg.Connection, q: Statements, items: Sequence[tuple[str, str, bytes]], now: datetime
) -> None:
    conn.execute(
        q(_INSERT_ITEMS),
        [
            now,
            arrays.texts([run_id for run_id, _, _ in items]),
            arrays.texts([key for _, key, _ in items]),
            arrays.byteas([value for _, _, value in items]),
        ],
    )
