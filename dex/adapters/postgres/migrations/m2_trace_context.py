"""Migration 2 (released): the tracing context of an activity task's run.

Frozen: this text is what databases at version 2 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.
"""

VERSION = 2

STATEMENTS: tuple[str, ...] = (
    # the tracing context of the run an activity task belongs to (JSON of the carrier), so its
    # span joins the run's trace; added to the parent, so every partition gets it
    "ALTER TABLE {s}.activity_tasks ADD COLUMN IF NOT EXISTS trace_context text",
)
