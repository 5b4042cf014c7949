"""Migration 18: published values and streams (docs/reference/contract.md §14).

Frozen once released: this text is what databases at version 18 are made with. It imports
nothing; never edit it (a change of schema is a new migration). ``{s}`` is the schema, filled
in by the runner as a quoted identifier.

Tables of their own, so that a reader never scans a run's history:

* ``published``: the latest value per (run, key), and how many times the key was published
  (``version``: a reader watching a key sees that it changed).
* ``stream_items``: every item, at its position in its stream (1, 2, 3 ... without gaps).
  Positions are given under the run's row lock (the writers take it first), so items commit
  in position order and a reader that asks for "after position n" misses none.
* ``closed_streams``: one row per stream that was closed.

No foreign keys (as since migration 3): retention deletes a run's rows itself. Run ids and keys
are ``COLLATE "C"``, as the runs' ids are: a join with the runs (retention) uses the primary
keys, and keys sort by code point, as Python sorts them.
"""

VERSION = 18

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.published (
        run_id        text COLLATE "C" NOT NULL,
        key           text COLLATE "C" NOT NULL,
        value         bytea NOT NULL,
        version       bigint NOT NULL,
        published_at  timestamptz NOT NULL,
        PRIMARY KEY (run_id, key)
    )
    """,
    """
    CREATE TABLE {s}.stream_items (
        run_id      text COLLATE "C" NOT NULL,
        key         text COLLATE "C" NOT NULL,
        position    bigint NOT NULL,
        value       bytea NOT NULL,
        written_at  timestamptz NOT NULL,
        PRIMARY KEY (run_id, key, position)
    )
    """,
    """
    CREATE TABLE {s}.closed_streams (
        run_id     text COLLATE "C" NOT NULL,
        key        text COLLATE "C" NOT NULL,
        closed_at  timestamptz NOT NULL,
        PRIMARY KEY (run_id, key)
    )
    """,
)
