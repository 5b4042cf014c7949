"""The PostgreSQL adapter's schedules (docs/reference/contract.md §10): the ``schedules`` table of migration 6.

A fire is one transaction (:meth:`PostgresSchedules.advance_schedule`): an ``UPDATE`` that
is a compare-and-set on the row's ``next_fire_at`` and ``buffered_fire_at`` (the row lock it
takes makes a racing leader's update wait and then find the old values gone, so it changes
nothing), and, when it applied and the fire starts a run, the schema's ``create_run`` in the
same transaction. Two statements per fire, whatever the number of engines; the leader's read
of the due rows is one statement per step, and followers read nothing.

:class:`PostgresSchedules` is a part of :class:`dex.adapters.postgres.PostgresAdapter`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors

from dex.adapters.postgres import direct, instance_keys, runs
from dex.adapters.postgres.database import Database
from dex.adapters.postgres.queues import PostgresQueues
from dex.adapters.postgres.refusals import refusals
from dex.adapters.postgres.rows import labels_json
from dex.adapters.postgres.schema import Statements
from dex.app.ports.schedules import ScheduleAdvance, ScheduleDefinition, ScheduledStart, ScheduleRecord
from dex.app.ports.store import WORKFLOW
from dex.domain.errors import InvalidStateError, NotFoundError
from dex.domain.values import Payload

_DEFINITION = (
    "name, workflow_name, cron, every, timezone, arg_encodings, arg_data, arg_types, jitter, overlap,"
    " catchup_window, start_at, end_at, queue, priority, labels, id_reuse"
)
_COLUMNS = _DEFINITION + ", created_at, paused, note, next_fire_at, due_at, buffered_fire_at, last_fire_at, last_run_id"


def _definition_params(d: ScheduleDefinition) -> list[object]:
    return [
        d.name,
        d.workflow_name,
        d.cron,
        d.every,
        d.timezone,
        [p.encoding for p in d.args],
        [p.data for p in d.args],
        [p.message_type for p in d.args],
        d.jitter,
        d.overlap,
        d.catchup_window,
        d.start_at,
        d.end_at,
        d.queue,
        d.priority,
        labels_json(d.labels),
        d.id_reuse,
    ]


def _record(row: tuple[Any, ...]) -> ScheduleRecord:
    (name, workflow, cron, every, timezone, encodings, data, types, jitter, overlap, catchup, start_at, end_at,
     queue, priority, labels, id_reuse, created_at, paused, note, next_fire, due, buffered, last_fire,
     last_run) = row  # fmt: skip
    definition = ScheduleDefinition(
        name=name,
        workflow_name=workflow,
        cron=cron,
        every=every,
        timezone=timezone,
        args=tuple(
            Payload(encoding=e, data=bytes(b), message_type=t) for e, b, t in zip(encodings, data, types, strict=True)
        ),
        jitter=jitter,
        overlap=overlap,
        catchup_window=catchup,
        start_at=start_at,
        end_at=end_at,
        queue=queue,
        priority=priority,
        labels=tuple(sorted(labels.items())),
        id_reuse=id_reuse,
    )
    return ScheduleRecord(
        definition=definition,
        created_at=created_at,
        paused=paused,
        note=note,
        next_fire_at=next_fire,
        due_at=due,
        buffered_fire_at=buffered,
        last_fire_at=last_fire,
        last_run_id=last_run,
    )


class PostgresSchedules:
    """The schedule-store ports of the PostgreSQL adapter. A fire that starts a run starts it
    with the adapter's start statement (``create_statement``), in the fire's transaction."""

    def __init__(
        self, db: Database, q: Statements, create_statement: direct.DirectStatement, queues: PostgresQueues
    ) -> None:
        self._db = db
        self._q = q
        self._create_run = create_statement
        self._queues = queues

    def create_schedule(self, record: ScheduleRecord) -> None:
        q = self._q
        params = _definition_params(record.definition)
        params += [record.created_at, record.paused, record.note, record.next_fire_at, record.due_at]
        with refusals():  # outside: a clash of names is not refused data
            try:
                with self._db.statement() as conn:
                    conn.execute(
                        q(
                            "INSERT INTO {s}.schedules (" + _DEFINITION + ", created_at, paused, note, next_fire_at,"
                            " due_at) VALUES (" + ", ".join(["%s"] * 22) + ")"
                        ),
                        params,
                    )
            except psycopg.errors.UniqueViolation:
                raise InvalidStateError(f"a schedule named {record.name!r} exists already") from None

    def update_schedule(
        self, definition: ScheduleDefinition, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        columns = [c.strip() for c in _DEFINITION.split(",")][1:]
        assignments = ", ".join(f"{c} = %s" for c in columns)
        params = [*_definition_params(definition)[1:], next_fire_at, due_at, definition.name]
        with refusals(), self._db.statement() as conn:
            cursor = conn.execute(
                self._q("UPDATE {s}.schedules SET " + assignments + ", next_fire_at = %s, due_at = %s WHERE name = %s"),
                params,
            )
            if cursor.rowcount == 0:
                raise NotFoundError(f"no schedule named {definition.name!r}")

    def delete_schedule(self, name: str) -> None:
        with self._db.statement() as conn:
            cursor = conn.execute(self._q("DELETE FROM {s}.schedules WHERE name = %s"), [name])
            if cursor.rowcount == 0:
                raise NotFoundError(f"no schedule named {name!r}")

    def set_schedule_paused(
        self, name: str, paused: bool, note: str, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        with refusals(), self._db.statement() as conn:
            cursor = conn.execute(
                self._q(
                    "UPDATE {s}.schedules SET paused = %s, note = %s, next_fire_at = %s, due_at = %s WHERE name = %s"
                ),
                [paused, note, next_fire_at, due_at, name],
            )
            if cursor.rowcount == 0:
                raise NotFoundError(f"no schedule named {name!r}")

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        with self._db.statement() as conn:
            row = conn.execute(self._q("SELECT " + _COLUMNS + " FROM {s}.schedules WHERE name = %s"), [name]).fetchone()
        return _record(row) if row is not None else None

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._db.statement() as conn:
            rows = conn.execute(self._q("SELECT " + _COLUMNS + " FROM {s}.schedules ORDER BY name")).fetchall()
        return [_record(row) for row in rows]

    def due_schedules(self, now: datetime, limit: int) -> tuple[list[ScheduleRecord], datetime | None]:
        # one round trip: the due rows (the partial index schedules_due; the rows holding a
        # buffered fire are few) and the earliest due_at after now, joined on the latter so
        # that a step with nothing due still gets one row
        qualified = ", ".join(f"d.{c.strip()}" for c in _COLUMNS.split(","))
        statement = (
            "WITH d AS (SELECT " + _COLUMNS + " FROM {s}.schedules WHERE NOT paused"
            " AND (due_at <= %(now)s OR buffered_fire_at IS NOT NULL) ORDER BY due_at NULLS LAST, name LIMIT %(limit)s),"
            " l AS (SELECT min(due_at) AS following FROM {s}.schedules WHERE NOT paused AND due_at > %(now)s)"
            " SELECT " + qualified + ", l.following FROM l LEFT JOIN d ON true"
        )
        with self._db.statement() as conn:
            rows = conn.execute(self._q(statement), {"now": now, "limit": limit}).fetchall()
        following = rows[0][-1] if rows else None
        return [_record(row[:-1]) for row in rows if row[0] is not None], following

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        start = advance.start
        if start is not None:
            self._queues.ensure_all([(start.created.queue, WORKFLOW)])
        q = self._q
        with self._db.transaction() as conn:
            # the compare-and-set; with a start, the run it proposes becomes the last run
            row = conn.execute(
                q(
                    "UPDATE {s}.schedules SET next_fire_at = %s, due_at = %s, buffered_fire_at = %s,"
                    " last_fire_at = CASE WHEN %s THEN %s ELSE last_fire_at END,"
                    " last_run_id = CASE WHEN %s THEN %s ELSE last_run_id END"
                    " WHERE name = %s AND next_fire_at IS NOT DISTINCT FROM %s"
                    " AND buffered_fire_at IS NOT DISTINCT FROM %s RETURNING 1"
                ),
                [
                    advance.next_fire_at,
                    advance.due_at,
                    advance.buffered_fire_at,
                    start is not None,
                    start.fire_at if start is not None else None,
                    start is not None,
                    start.run_id if start is not None else None,
                    advance.name,
                    advance.expected_next,
                    advance.expected_buffered,
                ],
            ).fetchone()
            if row is None:
                return False, None
            if start is None:
                return True, None
            return True, self._start(conn, advance.name, start, now)

    def trigger_schedule(self, name: str, start: ScheduledStart, now: datetime) -> str:
        self._queues.ensure_all([(start.created.queue, WORKFLOW)])
        with self._db.transaction() as conn:
            cursor = conn.execute(
                self._q("UPDATE {s}.schedules SET last_fire_at = %s, last_run_id = %s WHERE name = %s"),
                [start.fire_at, start.run_id, name],
            )
            if cursor.rowcount == 0:
                raise NotFoundError(f"no schedule named {name!r}")
            return self._start(conn, name, start, now)

    def _start(self, conn: psycopg.Connection, name: str, start: ScheduledStart, now: datetime) -> str:
        if start.rule.plain:
            run_id = runs.create_run(conn, self._q, self._create_run, start.run_id, start.created, now)[0]
        else:  # the schedule's id_reuse (docs/reference/contract.md §15), with the instance id's lock held
            run_id = instance_keys.start_keyed_run(
                conn, self._q, self._create_run, start.run_id, start.created, now, start.rule
            )
        if run_id != start.run_id:  # a live run holds the instance id (a backfill's): it is the last run
            conn.execute(self._q("UPDATE {s}.schedules SET last_run_id = %s WHERE name = %s"), [run_id, name])
        return run_id
