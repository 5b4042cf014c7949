"""Migration 12 (released): the engine registry (docs/reference/contract.md §15).

Frozen: this text is what databases at version 12 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

One row per started engine, keyed by its node id, written at its start and with its
leader-election heartbeat, deleted by its graceful stop; ``expires_at`` is the writer's (a
few heartbeat periods ahead), so readers list the rows not yet expired and a heartbeat
deletes the expired ones. Unlogged, as the leader's lease: after a server crash the table
is empty and every live engine writes its row again at its next heartbeat.
"""

VERSION = 12

STATEMENTS: tuple[str, ...] = (
    """
    CREATE UNLOGGED TABLE {s}.engines (
        node_id       text PRIMARY KEY,
        host          text NOT NULL,
        pid           integer NOT NULL,
        code_version  text,
        workflows     text[] NOT NULL,
        activities    text[] NOT NULL,
        queues        text[] NOT NULL,
        started_at    timestamptz NOT NULL,
        last_seen     timestamptz NOT NULL,
        expires_at    timestamptz NOT NULL
    )
    """,
)
