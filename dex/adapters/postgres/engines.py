"""The PostgreSQL adapter's engine registry (docs/reference/contract.md §15, :mod:`dex.app.ports.engines`).

A heartbeat is one statement: it deletes the rows expired before now (but the writer's own,
which its upsert then renews) and upserts the writer's row. The expired rows are taken with
``SKIP LOCKED``, so two engines beating at once never wait on each other's deletes.
"""

from __future__ import annotations

from datetime import datetime

from dex.adapters.postgres.database import Database
from dex.adapters.postgres.schema import Statements
from dex.app.ports.engines import EngineInfo, engine_info
from dex.domain.definitions import validate_text

_HEARTBEAT = (
    "WITH expired AS (DELETE FROM {s}.engines WHERE node_id IN ("
    "  SELECT node_id FROM {s}.engines WHERE expires_at < %(now)s AND node_id <> %(node_id)s"
    "  FOR UPDATE SKIP LOCKED))"
    " INSERT INTO {s}.engines AS e (node_id, host, pid, code_version, workflows, activities, queues,"
    "  started_at, last_seen, expires_at)"
    " VALUES (%(node_id)s, %(host)s, %(pid)s, %(code_version)s, %(workflows)b::text[], %(activities)b::text[],"
    "  %(queues)b::text[], %(started_at)s, %(now)s, %(expires_at)s)"
    " ON CONFLICT (node_id) DO UPDATE SET last_seen = excluded.last_seen, expires_at = excluded.expires_at"
)

_LIST = (
    "SELECT node_id, host, pid, code_version, workflows, activities, queues, started_at, last_seen"
    " FROM {s}.engines WHERE expires_at >= %s ORDER BY node_id"
)


class PostgresEngines:
    """The engine registry's statements over the adapter's connections."""

    def __init__(self, db: Database, q: Statements) -> None:
        self._db, self._q = db, q

    def heartbeat_engine(self, info: EngineInfo, now: datetime, expires_at: datetime) -> None:
        engine_info(info)  # refused before the write, as the in-memory adapter refuses it
        params = {
            "node_id": info.node_id,
            "host": info.host,
            "pid": info.pid,
            "code_version": info.code_version,
            "workflows": list(info.workflows),
            "activities": list(info.activities),
            "queues": list(info.queues),
            "started_at": info.started_at,
            "now": now,
            "expires_at": expires_at,
        }
        with self._db.statement() as conn:
            conn.execute(self._q(_HEARTBEAT), params)

    def remove_engine(self, node_id: str) -> None:
        validate_text(node_id, "node_id")
        with self._db.statement() as conn:
            conn.execute(self._q("DELETE FROM {s}.engines WHERE node_id = %s"), [node_id])

    def list_engines(self, now: datetime) -> list[EngineInfo]:
        with self._db.statement() as conn:
            rows = conn.execute(self._q(_LIST), [now]).fetchall()
        return [
            EngineInfo(
                node_id=node_id,
                host=host,
                pid=pid,
                code_version=code_version,
                workflows=tuple(workflows),
                activities=tuple(activities),
                queues=tuple(queues),
                started_at=started_at,
                last_seen=last_seen,
            )
            for node_id, host, pid, code_version, workflows, activities, queues, started_at, last_seen in rows
        ]
