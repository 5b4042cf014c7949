"""Migration 10 (released): activity steps' failed and lost attempts (docs/reference/contract.md §8).

Frozen: this text is what databases at version 10 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

One row per activity step (``run_id``, ``created_seq``: its ``ActivityTaskCreated``) that had
an attempt fail and be retried, or lost to an expired lease: never one for a step whose first
attempt succeeded, so a successful attempt writes nothing here. ``failed`` and ``lost`` count
them all; ``attempts``, ``kinds`` ('failed' or 'lost'), ``at`` and ``failures`` (a
``dex.v1.FailureInfo``; NULL for a lost attempt, which reported nothing) are the newest few,
newest first, as many as the code that writes them keeps. ``next_attempt`` is the number of the
attempt after the last of them. The row outlives the step's task (the step's outcome deletes
that) and goes with its run (retention).
"""

VERSION = 10

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.activity_attempts (
        run_id text COLLATE "C" NOT NULL,
        created_seq integer NOT NULL,
        failed integer NOT NULL DEFAULT 0,
        lost integer NOT NULL DEFAULT 0,
        next_attempt integer NOT NULL,
        attempts integer[] NOT NULL,
        kinds text[] NOT NULL,
        at timestamptz[] NOT NULL,
        failures bytea[] NOT NULL,
        PRIMARY KEY (run_id, created_seq)
    )
    """,
)
