"""Migration 7 (released): changing code safely (docs/reference/contract.md §11) — a run's code version and its
held workflow task.

Frozen: this text is what databases at version 7 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier; the runner also swaps the ``$$`` quotes for a dollar tag that
the schema's name does not contain, which leaves the bodies as they are.

``code_version`` is the version of the engine that started the run (``Engine(code_version=)``),
filterable by ``list_runs``; ``task_failure`` is a ``dex.v1.FailureInfo``, set while the run's
workflow task keeps failing (a history its code does not match: the run is held, not failed)
and cleared by the next result applied. ``create_run`` (migration 5) is replaced by a copy
that takes the code version as its last parameter.
"""

VERSION = 7

STATEMENTS: tuple[str, ...] = (
    'ALTER TABLE {s}.runs ADD COLUMN code_version text COLLATE "C"',
    "ALTER TABLE {s}.runs ADD COLUMN task_failure bytea",
    (
        "DROP FUNCTION {s}.create_run(text, text, text, text, integer, text, jsonb, text, timestamptz,"
        " bytea, text, bytea, boolean, text, timestamptz, text[], integer, text)"
    ),
    """
    CREATE FUNCTION {s}.create_run(
        p_run text, p_name text, p_queue text, p_instance text, p_priority integer, p_key text,
        p_labels jsonb, p_parent text, p_now timestamptz, p_event bytea, p_kind text, p_message bytea,
        p_claim boolean, p_owner text, p_until timestamptz, p_names text[], p_lock integer, p_schema text,
        p_code_version text
    ) RETURNS TABLE (
        out_run text, out_message bigint, out_task bigint, out_task_run text, out_workflow text,
        out_queue text, out_priority integer, out_owner text, out_until timestamptz, out_version integer
    )
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
    BEGIN
        RETURN QUERY
        WITH r AS (
            INSERT INTO {s}.runs AS n (run_id, workflow_name, queue, status, instance_id, priority,
                concurrency_key, labels, parent_run_id, created_at, last_seq, code_version)
            VALUES (p_run, p_name, p_queue, 'CREATED', p_instance, p_priority, p_key, p_labels,
                p_parent, p_now, 1, p_code_version)
            -- the arbiter is the partial unique index runs_live_instance: a live run with this
            -- instance id wins, and an insert racing with this one waits for it
            ON CONFLICT (instance_id) WHERE instance_id IS NOT NULL AND status IN ('CREATED', 'RUNNING', 'SUSPENDED')
            DO NOTHING
            RETURNING n.run_id, n.queue, n.workflow_name, n.priority, n.concurrency_key
        ),
        h AS (INSERT INTO {s}.history (run_id, first_seq, last_seq, events) SELECT r.run_id, 1, 1, p_event FROM r),
        i AS (
            INSERT INTO {s}.inbox AS m (run_id, kind, message, visible_from)
            SELECT r.run_id, p_kind, p_message, p_now FROM r RETURNING m.message_id
        ),
        t AS (
            INSERT INTO {s}.workflow_tasks AS w (queue, run_id, workflow_name, priority, locked_by,
                locked_until, lock_version)
            SELECT r.queue, r.run_id, r.workflow_name, r.priority, p_owner, p_until, 1
            FROM r JOIN {s}.queues qu ON qu.name = r.queue AND qu.kind = 'workflow'
            WHERE p_claim AND r.concurrency_key IS NULL AND NOT qu.paused
              AND r.workflow_name = ANY(p_names)
              AND (SELECT count(*) FROM {s}.workflow_tasks c WHERE c.queue = r.queue) < qu.capacity
              AND pg_try_advisory_xact_lock(p_lock, hashtext(p_schema))
            RETURNING w.task_id, w.run_id, w.workflow_name, w.queue, w.priority, w.locked_by,
                w.locked_until, w.lock_version
        )
        SELECT r.run_id, (SELECT i.message_id FROM i), t.task_id, t.run_id, t.workflow_name, t.queue,
            t.priority, t.locked_by, t.locked_until, t.lock_version
        FROM r LEFT JOIN t ON true;
    END
    $$
    """,
)
