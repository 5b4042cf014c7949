"""Migration 9 (released): a batch of finished activity attempts as one call of ``complete_activities``.

Frozen: this text is what databases at version 9 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier; the runner also swaps the ``$$`` quotes for a dollar tag that
the schema's name does not contain, which leaves the body as it is.

The function does in one statement, on an autocommit connection (the call is its own
transaction), what an activity completion sent as some ten statements in a pipelined
transaction, in the same order, under the same locks and with the same checks (the
adapter's ``activity_tasks``, ``workflow_tasks`` and ``dispatch`` modules at this version);
each statement inside runs with a snapshot of its own, so the dispatch, which follows the
scheduler's lock, sees what the lock's last holder committed:

1. the runs told, ``FOR SHARE`` in run id order (a run a workflow task is ending makes it
   wait; then the run is no longer live and gets no message);
2. the task rows ``FOR UPDATE`` in (queue, task_id) order; an outcome applies when the row is
   still held at its lease (owner and lock_version), and only the first such outcome of a task
   in the batch;
3. the applied tasks deleted, and their messages appended to the live runs' inboxes in the
   outcomes' order (message ids follow it);
4. the dispatch: the workflow scheduler's lock *tried* (never waited for), and if taken, the
   scheduler's choice among the runs told (its rules on capacity, pause and suspension; a run
   that needs a concurrency key is left to the scheduler), their tasks inserted in that order;
5. with ``p_claim``, a workflow claim (names, lease, pause, ``SKIP LOCKED``, priority then
   task id) and, with ``p_load``, each claimed task's input: the history blocks ending at or
   after the sequence number given for its run (0 when not given) and the messages visible
   at ``p_now``, in the inbox's order (``visible_from``, ``message_id``).

Rows come back tagged by ``out_part``: 0 an applied outcome's position (1-based) in the
arrays, 1 a claimed task, 2 a history block (``out_message`` its last sequence number), 3 a
message.

Plans: one generic plan per statement and session (``force_generic_plan``, as ``create_run``
does; measured: a lone activity completion 1.06–1.34 ms against 1.58–1.68 with ``auto``,
which plans each of the first five calls of a session anew): each statement finds its rows
by key (run ids, task keys, the runs told) or walks the workflow claim's index, so no plan
depends on a value's selectivity.
"""

VERSION = 9

STATEMENTS: tuple[str, ...] = (
    """
    CREATE FUNCTION {s}.complete_activities(
        p_queues text[], p_ids bigint[], p_owners text[], p_versions integer[], p_runs text[],
        p_kinds text[], p_messages bytea[], p_now timestamptz, p_lock integer, p_schema text,
        p_wakes text[], p_claim boolean, p_names text[], p_owner text, p_until timestamptz,
        p_limit integer, p_load boolean, p_after_runs text[], p_after_seqs integer[]
    ) RETURNS TABLE (
        out_part integer, out_ord bigint, out_task bigint, out_run text, out_workflow text,
        out_queue text, out_priority integer, out_version integer, out_visible timestamptz,
        out_message bigint, out_data bytea
    )
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
    DECLARE
        v_live text[];
        v_applied bigint[];
        v_told text[];
        v_task_ids bigint[];
        v_task_runs text[];
        v_task_names text[];
        v_task_queues text[];
        v_task_priorities integer[];
        v_task_versions integer[];
    BEGIN
        SELECT coalesce(array_agg(l.run_id), ARRAY[]::text[]) INTO v_live FROM (
            SELECT r.run_id FROM {s}.runs r
            WHERE r.run_id = ANY(p_runs) AND r.status IN ('CREATED', 'RUNNING', 'SUSPENDED')
            ORDER BY r.run_id FOR SHARE
        ) l;

        SELECT coalesce(array_agg(m.ord ORDER BY m.ord), ARRAY[]::bigint[]) INTO v_applied FROM (
            SELECT w.ord, row_number() OVER (PARTITION BY w.queue, w.task_id ORDER BY w.ord) AS nth
            FROM unnest(p_queues, p_ids, p_owners, p_versions) WITH ORDINALITY
                AS w(queue, task_id, owner, version, ord)
            JOIN (
                SELECT t.queue, t.task_id, t.locked_by, t.lock_version FROM {s}.activity_tasks t
                WHERE (t.queue, t.task_id) IN (SELECT k.queue, k.task_id FROM unnest(p_queues, p_ids) AS k(queue, task_id))
                ORDER BY t.queue, t.task_id FOR UPDATE OF t
            ) h ON h.queue = w.queue AND h.task_id = w.task_id AND h.locked_by = w.owner AND h.lock_version = w.version
        ) m WHERE m.nth = 1;

        IF cardinality(v_applied) = 0 THEN
            RETURN;
        END IF;

        DELETE FROM {s}.activity_tasks t
        USING unnest(p_queues, p_ids) WITH ORDINALITY AS d(queue, task_id, ord)
        WHERE d.ord = ANY(v_applied) AND t.queue = d.queue AND t.task_id = d.task_id;

        INSERT INTO {s}.inbox (run_id, kind, message, visible_from)
        SELECT m.run_id, m.kind, m.message, p_now
        FROM unnest(p_runs, p_kinds, p_messages) WITH ORDINALITY AS m(run_id, kind, message, ord)
        WHERE m.ord = ANY(v_applied) AND m.run_id = ANY(v_live)
        ORDER BY m.ord;

        v_told := ARRAY(
            SELECT DISTINCT o.run_id FROM unnest(p_runs) WITH ORDINALITY AS o(run_id, ord)
            WHERE o.ord = ANY(v_applied) ORDER BY o.run_id
        );

        IF pg_try_advisory_xact_lock(p_lock, hashtext(p_schema)) THEN
            INSERT INTO {s}.workflow_tasks (queue, run_id, workflow_name, priority)
            SELECT c.queue, c.run_id, c.workflow_name, c.priority FROM (
                WITH visible AS (
                    SELECT i.run_id, bool_or(i.kind = ANY(p_wakes)) AS cancel
                    FROM {s}.inbox i WHERE i.visible_from <= p_now AND i.run_id = ANY(v_told) GROUP BY i.run_id
                ),
                free AS (
                    SELECT q.name AS queue,
                           q.capacity - (SELECT count(*) FROM {s}.workflow_tasks t WHERE t.queue = q.name) AS slots
                    FROM {s}.queues q WHERE q.kind = 'workflow' AND NOT q.paused
                ),
                candidates AS (
                    SELECT r.run_id, r.workflow_name, r.queue, r.priority, r.created_at, r.position, r.concurrency_key,
                           (r.concurrency_key IS NOT NULL AND NOT r.holds_key AND NOT v.cancel) AS needs_key
                    FROM visible v
                    JOIN {s}.runs r ON r.run_id = v.run_id
                    JOIN free f ON f.queue = r.queue AND f.slots > 0
                    WHERE (r.status IN ('CREATED', 'RUNNING') OR (r.status = 'SUSPENDED' AND v.cancel))
                      AND NOT EXISTS (SELECT 1 FROM {s}.workflow_tasks t WHERE t.run_id = r.run_id AND t.queue = r.queue)
                ),
                keyed AS (
                    SELECT k.*, row_number() OVER (
                               PARTITION BY k.needs_key, k.concurrency_key ORDER BY k.priority DESC, k.created_at, k.position
                           ) AS key_rank
                    FROM candidates k
                    WHERE NOT k.needs_key OR NOT EXISTS (
                        SELECT 1 FROM {s}.runs h
                        WHERE h.holds_key AND h.concurrency_key = k.concurrency_key
                          AND h.status IN ('CREATED', 'RUNNING', 'SUSPENDED')
                    )
                ),
                ranked AS (
                    SELECT o.*, row_number() OVER (
                               PARTITION BY o.queue ORDER BY o.priority DESC, o.created_at, o.position
                           ) AS queue_rank
                    FROM keyed o WHERE NOT o.needs_key OR o.key_rank = 1
                )
                SELECT r.run_id, r.workflow_name, r.queue, r.priority, r.needs_key, r.created_at, r.position
                FROM ranked r JOIN free f ON f.queue = r.queue
                WHERE r.queue_rank <= f.slots
                ORDER BY r.priority DESC, r.created_at, r.position
                LIMIT cardinality(v_told)
            ) c
            WHERE NOT c.needs_key
            ORDER BY c.priority DESC, c.created_at, c.position;
        END IF;

        IF p_claim THEN
            WITH claimable AS (
                SELECT t.queue, t.task_id FROM {s}.workflow_tasks t
                WHERE t.workflow_name = ANY(p_names)
                  AND (t.locked_until IS NULL OR t.locked_until <= p_now)
                  AND t.queue IN (SELECT qu.name FROM {s}.queues qu WHERE qu.kind = 'workflow' AND NOT qu.paused)
                ORDER BY t.priority DESC, t.task_id
                LIMIT p_limit
                FOR UPDATE OF t SKIP LOCKED
            ),
            claimed AS (
                UPDATE {s}.workflow_tasks t
                SET locked_by = p_owner, locked_until = p_until, lock_version = t.lock_version + 1
                FROM claimable c WHERE t.queue = c.queue AND t.task_id = c.task_id
                RETURNING t.task_id, t.run_id, t.workflow_name, t.queue, t.priority, t.lock_version
            )
            SELECT coalesce(array_agg(c.task_id), ARRAY[]::bigint[]), coalesce(array_agg(c.run_id), ARRAY[]::text[]),
                   coalesce(array_agg(c.workflow_name), ARRAY[]::text[]), coalesce(array_agg(c.queue), ARRAY[]::text[]),
                   coalesce(array_agg(c.priority), ARRAY[]::integer[]), coalesce(array_agg(c.lock_version), ARRAY[]::integer[])
            INTO v_task_ids, v_task_runs, v_task_names, v_task_queues, v_task_priorities, v_task_versions
            FROM claimed c;

            RETURN QUERY
            SELECT 1, NULL::bigint, c.task_id, c.run_id, c.workflow_name, c.queue, c.priority, c.version,
                NULL::timestamptz, NULL::bigint, NULL::bytea
            FROM unnest(v_task_ids, v_task_runs, v_task_names, v_task_queues, v_task_priorities, v_task_versions)
                AS c(task_id, run_id, workflow_name, queue, priority, version);

            IF p_load AND cardinality(v_task_ids) > 0 THEN
                RETURN QUERY
                SELECT 2, NULL::bigint, NULL::bigint, w.run_id, NULL::text, NULL::text, NULL::integer,
                    NULL::integer, NULL::timestamptz, b.last_seq::bigint, b.events
                FROM (
                    SELECT c.run_id, coalesce(a.after_seq, 0) AS after_seq
                    FROM unnest(v_task_runs) AS c(run_id)
                    LEFT JOIN unnest(p_after_runs, p_after_seqs) AS a(run_id, after_seq) ON a.run_id = c.run_id
                ) w
                CROSS JOIN LATERAL (
                    SELECT hb.last_seq, hb.events FROM {s}.history hb
                    WHERE hb.run_id = w.run_id AND hb.last_seq >= w.after_seq OFFSET 0
                ) b
                UNION ALL
                SELECT 3, NULL::bigint, NULL::bigint, i.run_id, NULL::text, NULL::text, NULL::integer,
                    NULL::integer, i.visible_from, i.message_id, i.message
                FROM {s}.inbox i WHERE i.run_id = ANY(v_task_runs) AND i.visible_from <= p_now
                ORDER BY 4, 1, 9, 10;
            END IF;
        END IF;

        RETURN QUERY SELECT 0, a, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
            NULL::timestamptz, NULL::bigint, NULL::bytea
        FROM unnest(v_applied) AS a;
    END
    $$
    """,
)
