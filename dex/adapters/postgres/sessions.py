"""The state of dex's sessions: what the pool sets on each connection it opens (and the
transaction steps' own connections get the same), and how a session is given that state back
after a transaction step's function ran on it.

Every session of dex's carries its settings (:func:`session_settings`). A ``@dex.transaction``
step's function runs on a connection of the steps' own (:mod:`.step_sessions`), and whatever it
does to the *session* outlives its transaction: a ``SET`` (not ``SET LOCAL``) that commits,
``SET ROLE``, a session advisory lock, ``LISTEN``, a temporary table, a cursor ``WITH HOLD``.
Left as it is, the connection serves the next steps, dex's own statements in their
transactions included: with a ``statement_timeout`` of a millisecond every one of them is
cancelled, with ``default_transaction_read_only`` every completion fails, and the steps are
given back again and again (measured when steps ran on the pool's connections, which the
engine's threads share: 40 healthy three-step runs took 25 s instead of 0.3 s after one step
set ``default_transaction_read_only = on``). So when a step's attempt (or a group of them) is
over, :func:`session_restore` undoes all that in one round trip before the connection is kept
for the next, and a session it cannot restore is closed (a new one is opened when needed).

What ``DISCARD ALL`` undoes, it undoes too, but for the prepared statements: psycopg keeps its
own in step with the server's, so the engine's statements stay prepared across steps. The same
round trip lists the session's prepared statements; should one that psycopg counts on be gone
(the function ran ``DEALLOCATE``), the engine's statements would fail on that session from then
on, so it is closed instead (psycopg's list is read from its connection's private state, where
psycopg keeps it, on the versions it was checked on: :func:`prepared_by_psycopg`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg

from dex.adapters.postgres import arrays

log = logging.getLogger(__name__)

# Every statement the adapter issues is a short indexed operation (milliseconds); the longest
# are a retention batch and a completion waiting for a run row another transaction holds.
# Thirty seconds leaves those ample room and still ends a runaway statement.
STATEMENT_TIMEOUT = timedelta(seconds=30)
# The adapter never waits for anything between the statements of a transaction; a session idle
# inside one belongs to a process that is stuck (or stopped), and its row locks block others.
IDLE_IN_TRANSACTION_TIMEOUT = timedelta(seconds=60)

# DISCARD ALL without its DEALLOCATE ALL (and without DISCARD PLANS, which only costs plans)
_RESET = (
    "CLOSE ALL",
    "SET SESSION AUTHORIZATION DEFAULT",
    "RESET ALL",
    "UNLISTEN *",
    "SELECT pg_advisory_unlock_all()",
    "DISCARD TEMP",
    "DISCARD SEQUENCES",
)


def _milliseconds(limit: timedelta) -> int:
    return max(0, round(limit.total_seconds() * 1000))  # 0 turns the limit off


def settings_query(
    statement_timeout: timedelta = STATEMENT_TIMEOUT,
    idle_in_transaction_timeout: timedelta = IDLE_IN_TRANSACTION_TIMEOUT,
) -> str:
    """dex's session settings as one simple query, for the pool's connections and any other of
    dex's own (each value dex's: a zone name, a mode, milliseconds as integers; nothing from a
    caller is quoted into it)."""
    return "; ".join(
        (
            "SET TIME ZONE 'UTC'",
            "SET plan_cache_mode = force_custom_plan",
            f"SET statement_timeout = {_milliseconds(statement_timeout)}",
            f"SET idle_in_transaction_session_timeout = {_milliseconds(idle_in_transaction_timeout)}",
        )
    )


def session_settings(
    statement_timeout: timedelta = STATEMENT_TIMEOUT,
    idle_in_transaction_timeout: timedelta = IDLE_IN_TRANSACTION_TIMEOUT,
) -> Callable[[psycopg.Connection], None]:
    """The ``configure`` callback of the pool: session settings of every pooled connection.

    Timestamps are computed from the caller's clock and stored as timestamptz; reading them in
    UTC, and adding intervals (lease timeouts) in UTC, keeps them exact and free of DST jumps.
    The time limits are enforced by the server: it cancels the statement (the caller gets an
    error, its transaction rolls back) or closes the idle session (its locks are released).

    Plans are always made for the actual parameters (``plan_cache_mode``). psycopg prepares a
    statement after a few executions, and PostgreSQL may then switch it to a generic plan,
    made without the values: it would guess that ``visible_from <= $1`` matches a third of the
    inbox and scan the inbox and ``runs`` whole, and a connection keeps that plan. The polling
    statements are planned in well under a millisecond; a scan of every finished run is not.
    """
    query = settings_query(statement_timeout, idle_in_transaction_timeout)

    def configure(conn: psycopg.Connection) -> None:
        arrays.register(conn)  # the batch statements' arrays, packed ahead (arrays.py)
        conn.execute(query, prepare=False)

    return configure


def session_restore(
    statement_timeout: timedelta = STATEMENT_TIMEOUT,
    idle_in_transaction_timeout: timedelta = IDLE_IN_TRANSACTION_TIMEOUT,
) -> Callable[[psycopg.Connection], None]:
    """What gives a session back the state :func:`session_settings` gave it, after a
    transaction step's function ran on it (the connection idle again, in autocommit): one round
    trip. A session it cannot restore (the step's overrun ended it, say) is closed; nothing is raised but a ``BaseException`` that is not an
    ``Exception`` (the step's outcome was decided before: a restore never changes it)."""
    query = restore_query(statement_timeout, idle_in_transaction_timeout)

    def restore(conn: psycopg.Connection) -> None:
        if conn.closed:
            return
        try:
            cursor = conn.execute(query, prepare=False)
            while cursor.nextset():  # the last result: the session's prepared statements
                pass
            missing = missing_prepared(conn, cursor.fetchone())
        except Exception as exc:  # noqa: BLE001 - not restored: not used again
            log.info("a transaction step's session could not be restored (%s); it is closed", type(exc).__name__)
            conn.close()
            return
        except BaseException:
            conn.close()
            raise
        if missing:
            log.info("a transaction step deallocated prepared statements of its session; it is closed")
            conn.close()

    return restore


_PREPARED = "SELECT coalesce(array_agg(name::text), '{}') FROM pg_prepared_statements WHERE NOT from_sql"


def restore_query(
    statement_timeout: timedelta = STATEMENT_TIMEOUT,
    idle_in_transaction_timeout: timedelta = IDLE_IN_TRANSACTION_TIMEOUT,
) -> str:
    """The restore as one simple query; its last result is one row, the session's prepared
    statements (for :func:`missing_prepared`)."""
    return "; ".join((*_RESET, settings_query(statement_timeout, idle_in_transaction_timeout), _PREPARED))


def missing_prepared(conn: psycopg.Connection | psycopg.AsyncConnection, row: Sequence[Any] | None) -> bool:
    """Whether a statement psycopg has prepared on ``conn`` is gone from the server's list
    ``row`` (the restore's last result); never where psycopg's record of them cannot be read
    (:func:`prepared_by_psycopg`)."""
    ours = prepared_by_psycopg(conn)
    if not ours:
        return False
    return bool(ours - set(row[0] if row is not None else ()))


# psycopg keeps the names of the statements it prepared on a connection in private state
# (``conn._prepared._names``: a mapping of query keys to names), with no public way to list
# them. It is read only on the psycopg versions it was checked on; on another the restore skips
# the check (a session whose prepared statements a step deallocated may then fail dex's
# statements on it), and tests/integration/test_transaction_sessions.py fails, saying to check
# the record on that version and widen the range.
PREPARED_RECORD_CHECKED = ((3, 3), (3, 3))  # the first and last minor versions it was checked on


def _psycopg_version() -> tuple[int, int]:
    try:
        major, minor = psycopg.__version__.split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return (0, 0)


def prepared_by_psycopg(conn: psycopg.Connection | psycopg.AsyncConnection) -> set[str] | None:
    """The names of the statements psycopg prepared on ``conn``; None on a psycopg whose record of
    them is not checked, or not what this expects."""
    first, last = PREPARED_RECORD_CHECKED
    if not first <= _psycopg_version() <= last:
        return None
    names = getattr(getattr(conn, "_prepared", None), "_names", None)
    if not isinstance(names, Mapping):
        return None
    return {name.decode() for name in names.values() if isinstance(name, bytes)}
