"""Migration 15 (released): a queue's key concurrency and rate limit, and its start slots
(docs/reference/contract.md §15).

Frozen: this text is what databases at version 15 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

``key_concurrency``: how many live runs may hold a concurrency key at once when this queue's
scheduler grants it (1 before this migration: one at a time).

A rate limit is ``rate_count`` starts in any window of ``rate_period_us`` microseconds (an
integer, not an interval: ``timestamptz - interval '1 day'`` follows the session's daylight
saving time, a microsecond count does not). A queue with one has ``rate_count`` rows in
``queue_starts``, its start slots: a claim takes slots whose ``last_start`` is at least a
period old, ``FOR UPDATE SKIP LOCKED``, and stamps them with its time, so concurrent claims
take different slots and none waits for another (no single row that every claim updates).

``paused`` becomes a generated column: true when the operator paused the queue
(``operator_paused``) or when it has a rate limit. Every statement that starts a task without
taking a start slot -- the plain claims, a new run's first task claimed with its creation
(``create_run``), the claim in ``complete_activities``, answered steps, inline attempts --
already keeps off a queue whose ``paused`` is true, so a rate-limited queue's tasks are
started only by the claims that take slots, and those statements (frozen functions among
them) stay as they are. The schedulers read ``operator_paused``: a rate-limited queue's tasks
are still scheduled.
"""

VERSION = 15

STATEMENTS: tuple[str, ...] = (
    """
    ALTER TABLE {s}.queues
        ADD COLUMN operator_paused boolean NOT NULL DEFAULT false,
        ADD COLUMN key_concurrency integer NOT NULL DEFAULT 1 CHECK (key_concurrency > 0),
        ADD COLUMN rate_count integer CHECK (rate_count BETWEEN 1 AND 100000),
        ADD COLUMN rate_period_us bigint CHECK (rate_period_us > 0),
        ADD CONSTRAINT queues_rate_limit_whole CHECK ((rate_count IS NULL) = (rate_period_us IS NULL))
    """,
    "UPDATE {s}.queues SET operator_paused = paused",
    "ALTER TABLE {s}.queues DROP COLUMN paused",
    """
    ALTER TABLE {s}.queues
        ADD COLUMN paused boolean GENERATED ALWAYS AS (operator_paused OR rate_count IS NOT NULL) STORED
    """,
    """
    CREATE TABLE {s}.queue_starts (
        kind text COLLATE "C" NOT NULL,
        queue text COLLATE "C" NOT NULL,
        slot integer NOT NULL,
        last_start timestamptz NOT NULL DEFAULT '-infinity',
        PRIMARY KEY (kind, queue, slot)
    )
    """,
    "CREATE INDEX queue_starts_oldest ON {s}.queue_starts (kind, queue, last_start)",
)
