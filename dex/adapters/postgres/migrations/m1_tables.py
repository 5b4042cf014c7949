"""Migration 1 (released): the tables, their indexes and the leader lease.

Frozen: this text is what databases at version 1 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner (``dex.adapters.postgres.schema.migrate``) as a quoted identifier.

Status lists are spelled out literally wherever a partial index must match: the planner can
only use a partial index whose predicate the query implies (``schema.LIVE`` and
``schema.TERMINAL`` are the live code's copies of these lists).
"""

VERSION = 1

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.queues (
        kind text COLLATE "C" NOT NULL CHECK (kind IN ('workflow', 'activity')),
        name text COLLATE "C" NOT NULL,
        capacity integer NOT NULL CHECK (capacity > 0),
        paused boolean NOT NULL DEFAULT false,
        PRIMARY KEY (kind, name)
    )
    """,
    """
    CREATE TABLE {s}.runs (
        run_id text COLLATE "C" PRIMARY KEY,
        -- creation order: breaks ties between runs created at the same instant
        position bigint GENERATED ALWAYS AS IDENTITY,
        workflow_name text COLLATE "C" NOT NULL,
        queue text COLLATE "C" NOT NULL,
        status text NOT NULL CHECK (status IN ('CREATED', 'RUNNING', 'SUSPENDED', 'COMPLETED', 'FAILED', 'CANCELLED')),
        instance_id text COLLATE "C",
        priority integer NOT NULL,
        concurrency_key text COLLATE "C",
        labels jsonb NOT NULL,
        parent_run_id text COLLATE "C",
        created_at timestamptz NOT NULL,
        started_at timestamptz,
        completed_at timestamptz,
        custom_status text,
        result bytea,
        failure bytea,
        -- the run holds its concurrency key from its first workflow task until it ends
        holds_key boolean NOT NULL DEFAULT false,
        -- sequence number of the last history event: completions compare it under the row lock
        last_seq integer NOT NULL
    )
    """,
    # one live run per instance id; a run leaves the index when it ends
    "CREATE UNIQUE INDEX runs_live_instance ON {s}.runs (instance_id) "
    "WHERE instance_id IS NOT NULL AND status IN ('CREATED', 'RUNNING', 'SUSPENDED')",
    "CREATE INDEX runs_newest ON {s}.runs (created_at DESC, position DESC)",
    "CREATE INDEX runs_finished ON {s}.runs (completed_at) WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')",
    "CREATE INDEX runs_key_holders ON {s}.runs (concurrency_key) WHERE holds_key",
    "CREATE INDEX runs_labels ON {s}.runs USING gin (labels jsonb_path_ops)",
    """
    CREATE TABLE {s}.history (
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        seq integer NOT NULL,
        event bytea NOT NULL,
        -- a racing duplicate workflow task that got past the last_seq check still loses here
        PRIMARY KEY (run_id, seq)
    )
    """,
    """
    CREATE TABLE {s}.inbox (
        message_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        kind text NOT NULL,
        message bytea NOT NULL,
        visible_from timestamptz NOT NULL
    )
    """,
    "CREATE INDEX inbox_run ON {s}.inbox (run_id, message_id)",
    "CREATE INDEX inbox_visible ON {s}.inbox (visible_from, run_id)",
    """
    CREATE TABLE {s}.workflow_tasks (
        queue text COLLATE "C" NOT NULL,
        task_id bigserial,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        workflow_name text COLLATE "C" NOT NULL,
        priority integer NOT NULL,
        locked_by text,
        locked_until timestamptz,
        lock_version integer NOT NULL DEFAULT 0,
        PRIMARY KEY (queue, task_id),
        UNIQUE (run_id, queue)  -- at most one workflow task per run (a run never changes queue)
    ) PARTITION BY LIST (queue)
    """,
    # completed workflow tasks are deleted, so the table only ever holds live tasks
    "CREATE INDEX workflow_tasks_claim ON {s}.workflow_tasks (priority DESC, task_id)",
    "CREATE INDEX workflow_tasks_lease ON {s}.workflow_tasks (locked_until) WHERE locked_until IS NOT NULL",
    """
    CREATE TABLE {s}.activity_tasks (
        queue text COLLATE "C" NOT NULL,
        task_id bigserial,
        run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
        created_seq integer NOT NULL,
        name text COLLATE "C" NOT NULL,
        input bytea NOT NULL,
        priority integer NOT NULL,
        retry_policy bytea NOT NULL,
        lock_timeout interval NOT NULL,
        visible_from timestamptz NOT NULL,
        attempt integer NOT NULL DEFAULT 1,
        -- CREATED: waiting to become visible (first attempt or retry); QUEUED: claimable or claimed
        state text NOT NULL DEFAULT 'CREATED' CHECK (state IN ('CREATED', 'QUEUED')),
        locked_by text,
        locked_until timestamptz,
        lock_version integer NOT NULL DEFAULT 0,
        PRIMARY KEY (queue, task_id)
    ) PARTITION BY LIST (queue)
    """,
    "CREATE INDEX activity_tasks_waiting ON {s}.activity_tasks (priority DESC, task_id) WHERE state = 'CREATED'",
    "CREATE INDEX activity_tasks_due ON {s}.activity_tasks (visible_from) WHERE state = 'CREATED'",
    "CREATE INDEX activity_tasks_claim ON {s}.activity_tasks (priority DESC, task_id) WHERE state = 'QUEUED'",
    "CREATE INDEX activity_tasks_lease ON {s}.activity_tasks (locked_until) WHERE locked_until IS NOT NULL",
    "CREATE INDEX activity_tasks_run ON {s}.activity_tasks (run_id)",
    # UNLOGGED: a lease is worthless after a crash anyway, and renewals then cost no WAL
    """
    CREATE UNLOGGED TABLE {s}.leader (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        node_id text NOT NULL,
        lease_until timestamptz NOT NULL
    )
    """,
)
