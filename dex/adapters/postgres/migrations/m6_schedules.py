"""Migration 6 (released): the ``schedules`` table (docs/reference/contract.md §10).

Frozen: this text is what databases at version 6 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

One row per schedule: its definition (the workflow's arguments encoded, as three parallel
arrays of a payload's fields), an operator's pause and note, and its state. The leader reads
the due rows through ``schedules_due`` (a partial index: paused rows cost nothing) and fires
each with a compare-and-set on ``next_fire_at``/``buffered_fire_at``.
"""

VERSION = 6

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS {s}.schedules (
        name text PRIMARY KEY,
        workflow_name text NOT NULL,
        cron text,
        every interval,
        timezone text NOT NULL,
        arg_encodings text[] NOT NULL,
        arg_data bytea[] NOT NULL,
        arg_types text[] NOT NULL,
        jitter interval NOT NULL,
        overlap text NOT NULL,
        catchup_window interval NOT NULL,
        start_at timestamptz,
        end_at timestamptz,
        queue text NOT NULL,
        priority integer NOT NULL,
        labels jsonb NOT NULL,
        created_at timestamptz NOT NULL,
        paused boolean NOT NULL,
        note text NOT NULL,
        next_fire_at timestamptz,
        due_at timestamptz,
        buffered_fire_at timestamptz,
        last_fire_at timestamptz,
        last_run_id text
    )
    """,
    "CREATE INDEX IF NOT EXISTS schedules_due ON {s}.schedules (due_at) WHERE NOT paused",
)
