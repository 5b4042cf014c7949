"""Migration 13 (released): how runs end (docs/reference/contract.md §14).

Frozen: this text is what databases at version 13 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

* ``runs.status`` takes ``TERMINATED`` (``engine.terminate``), a terminal status: the index
  of finished runs (retention) is made again with it, so that it still matches the live code's
  ``schema.TERMINAL``.
* ``runs.deadline``: when the run is cancelled with reason "timeout" (``start_workflow(timeout=)``,
  ``ctx.child(timeout=)``), shown as ``RunInfo.deadline``; the cancel request itself waits in
  the inbox until then.
* ``runs.unread_events``: how many events the run received and never read, recorded when it
  ends (``RunInfo.unread_events``).
"""

VERSION = 13

STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check",
    "ALTER TABLE {s}.runs ADD CONSTRAINT runs_status_check"
    " CHECK (status IN ('CREATED', 'RUNNING', 'SUSPENDED', 'COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED'))",
    "DROP INDEX {s}.runs_finished",
    "CREATE INDEX runs_finished ON {s}.runs (completed_at)"
    " WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED')",
    "ALTER TABLE {s}.runs ADD COLUMN deadline timestamptz",
    "ALTER TABLE {s}.runs ADD COLUMN unread_events integer NOT NULL DEFAULT 0",
)
