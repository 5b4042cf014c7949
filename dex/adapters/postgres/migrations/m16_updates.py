"""Migration 16 (released): the answers of ``engine.update`` (docs/reference/contract.md §14).

Frozen: this text is what databases at version 16 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

One row per answered update, keyed by its run and update id, written in the transaction that
writes the history block holding its ``UpdateCompleted`` (or, for a request refused, the block
of the task that refused it). ``result`` and ``failure`` are protobuf bytes, as in ``runs``;
``rejected`` marks a refusal that left no trace in the history, which a new request with the
same id replaces. Retention deletes a run's answers with the run.
"""

VERSION = 16

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.update_answers (
        run_id       text COLLATE "C" NOT NULL,
        update_id    text COLLATE "C" NOT NULL,
        result       bytea,
        failure      bytea,
        rejected     boolean NOT NULL,
        answered_at  timestamptz NOT NULL,
        PRIMARY KEY (run_id, update_id)
    )
    """,
)
