"""Migration 9 (released): the completions' writes as calls of two functions.

Frozen: this text is what databases at version 9 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier; the runner also swaps the ``$$`` quotes for a dollar tag that
the schema's name does not contain, which leaves the bodies as they are.

Each function does in one statement what a completion sent as some eight statements, in the
same order, under the same locks and with the same checks as those statements (the
adapter's ``activity_tasks``, ``completion``, ``workflow_tasks`` and ``dispatch`` modules at
this version), and each statement inside runs with a snapshot of its own, so one that
follows the scheduler's lock sees what the lock's last holder committed.

Plans: ``complete_activities`` keeps one generic plan per statement and session
(``force_generic_plan``, as ``create_run`` does; measured: a lone activity completion
1.06–1.34 ms against 1.58–1.68 with ``auto``, which plans each of the first five calls of a
session anew): each of its statements finds its rows by key (run ids, task keys, the runs
told) or walks the workflow claim's index, so no plan depends on a value's selectivity.
``complete_workflow_writes`` keeps ``auto``, as the pipelined statements it replaces: its
activity dispatch chooses among the waiting tasks those due by ``p_now``, and its generic
plan walks the waiting tasks in priority order, those due later (retries) included (seen over
200,000 waiting tasks), where a plan for the value may take the due-time index; measured,
``auto`` cost this function nothing (a lone workflow completion 2.2–2.4 ms either way).

``complete_activities``: a batch of finished activity attempts (no retry among them), on an
autocommit connection (the call is its own transaction):

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

``complete_workflow_writes``: one round of a workflow completion's writes, inside the
completion's transaction (which has locked the runs and deleted the tasks whose lease held,
and checked each result against its run): the consumed messages deleted, the run rows
updated, the history blocks and the activity tasks inserted, the ended runs' messages and
activity tasks deleted (those locked in (queue, task_id) order), the messages inserted; then,
as asked, the activity scheduler's statement under its lock (tried), the workflow dispatch of
the runs told (as above) and an activity claim, whose rows it returns. Child runs and
continue-as-new are not among its writes (those batches keep their statements).
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
    """
    CREATE FUNCTION {s}.complete_workflow_writes(
        p_now timestamptz, p_consumed bigint[], p_touched text[],
        p_runs text[], p_statuses text[], p_started boolean[], p_set_custom boolean[], p_custom text[],
        p_last_seqs integer[], p_finished boolean[], p_results bytea[], p_failures bytea[],
        p_h_runs text[], p_h_firsts integer[], p_h_lasts integer[], p_h_events bytea[],
        p_a_queues text[], p_a_runs text[], p_a_seqs integer[], p_a_names text[], p_a_inputs bytea[],
        p_a_priorities integer[], p_a_policies bytea[], p_a_timeouts interval[], p_a_visible timestamptz[],
        p_a_traces text[], p_a_attempts integer[],
        p_ended text[],
        p_m_runs text[], p_m_kinds text[], p_m_messages bytea[], p_m_visible timestamptz[],
        p_schema text, p_dispatch_activities boolean, p_activity_lock integer, p_dispatch_limit integer,
        p_told text[], p_workflow_lock integer, p_wakes text[],
        p_claim boolean, p_names text[], p_owner text, p_lease interval, p_limit integer
    ) RETURNS TABLE (
        out_task bigint, out_run text, out_created_seq integer, out_name text, out_input bytea, out_queue text,
        out_priority integer, out_attempt integer, out_retry_policy bytea, out_lock_timeout interval,
        out_owner text, out_until timestamptz, out_version integer, out_trace_context text
    )
    LANGUAGE plpgsql
    SET plan_cache_mode = auto
    AS $$
    BEGIN
        IF cardinality(p_consumed) > 0 THEN
            DELETE FROM {s}.inbox WHERE message_id = ANY(p_consumed) AND run_id = ANY(p_touched);
        END IF;

        IF cardinality(p_runs) > 0 THEN
            UPDATE {s}.runs r SET status = u.status,
                started_at = CASE WHEN u.started THEN p_now ELSE r.started_at END,
                custom_status = CASE WHEN u.set_custom THEN u.custom_status ELSE r.custom_status END,
                last_seq = u.last_seq,
                completed_at = CASE WHEN u.finished THEN p_now ELSE r.completed_at END,
                result = CASE WHEN u.finished THEN u.result ELSE r.result END,
                failure = CASE WHEN u.finished THEN u.failure ELSE r.failure END,
                holds_key = r.holds_key AND NOT u.finished,
                task_failure = NULL
            FROM unnest(p_runs, p_statuses, p_started, p_set_custom, p_custom, p_last_seqs, p_finished,
                        p_results, p_failures)
                AS u(run_id, status, started, set_custom, custom_status, last_seq, finished, result, failure)
            WHERE r.run_id = u.run_id;
        END IF;

        IF cardinality(p_h_runs) > 0 THEN
            INSERT INTO {s}.history (run_id, first_seq, last_seq, events)
            SELECT * FROM unnest(p_h_runs, p_h_firsts, p_h_lasts, p_h_events);
        END IF;

        IF cardinality(p_a_queues) > 0 THEN
            INSERT INTO {s}.activity_tasks (queue, run_id, created_seq, name, input, priority,
                retry_policy, lock_timeout, visible_from, trace_context, attempt)
            SELECT a.queue, a.run_id, a.created_seq, a.name, a.input, a.priority, a.retry_policy,
                a.lock_timeout, a.visible_from, a.trace_context, a.attempt
            FROM unnest(p_a_queues, p_a_runs, p_a_seqs, p_a_names, p_a_inputs, p_a_priorities, p_a_policies,
                        p_a_timeouts, p_a_visible, p_a_traces, p_a_attempts) WITH ORDINALITY
                AS a(queue, run_id, created_seq, name, input, priority, retry_policy, lock_timeout,
                     visible_from, trace_context, attempt, ord)
            ORDER BY a.ord;
        END IF;

        IF cardinality(p_ended) > 0 THEN
            DELETE FROM {s}.inbox WHERE run_id = ANY(p_ended);
            -- task rows are locked in (queue, task_id) order, as everywhere else, before they go
            DELETE FROM {s}.activity_tasks t WHERE (t.queue, t.task_id) IN (
                SELECT k.queue, k.task_id FROM {s}.activity_tasks k WHERE k.run_id = ANY(p_ended)
                ORDER BY k.queue, k.task_id FOR UPDATE);
        END IF;

        IF cardinality(p_m_runs) > 0 THEN
            INSERT INTO {s}.inbox (run_id, kind, message, visible_from)
            SELECT m.run_id, m.kind, m.message, m.visible_from
            FROM unnest(p_m_runs, p_m_kinds, p_m_messages, p_m_visible) WITH ORDINALITY
                AS m(run_id, kind, message, visible_from, ord)
            ORDER BY m.ord;
        END IF;

        -- (nested IFs: SQL does not promise to evaluate AND from the left, and the lock is only
        -- to be tried when there is something to dispatch)
        IF p_dispatch_activities THEN IF pg_try_advisory_xact_lock(p_activity_lock, hashtext(p_schema)) THEN
            WITH free AS (
                SELECT q.name AS queue,
                       q.capacity - (SELECT count(*) FROM {s}.activity_tasks t
                                     WHERE t.queue = q.name AND t.state = 'QUEUED') AS slots
                FROM {s}.queues q WHERE q.kind = 'activity' AND NOT q.paused
            ),
            chosen AS (
                SELECT w.queue, w.task_id FROM free f
                CROSS JOIN LATERAL (
                    SELECT t.queue, t.task_id, t.priority FROM {s}.activity_tasks t
                    WHERE t.queue = f.queue AND t.state = 'CREATED' AND t.visible_from <= p_now
                    ORDER BY t.priority DESC, t.task_id
                    LIMIT greatest(least(f.slots, p_dispatch_limit), 0)
                    FOR UPDATE OF t SKIP LOCKED
                ) w
                ORDER BY w.priority DESC, w.task_id
                LIMIT p_dispatch_limit
            )
            UPDATE {s}.activity_tasks t SET state = 'QUEUED'
            FROM chosen c WHERE t.queue = c.queue AND t.task_id = c.task_id;
        END IF; END IF;

        IF cardinality(p_told) > 0 THEN IF pg_try_advisory_xact_lock(p_workflow_lock, hashtext(p_schema)) THEN
            INSERT INTO {s}.workflow_tasks (queue, run_id, workflow_name, priority)
            SELECT c.queue, c.run_id, c.workflow_name, c.priority FROM (
                WITH visible AS (
                    SELECT i.run_id, bool_or(i.kind = ANY(p_wakes)) AS cancel
                    FROM {s}.inbox i WHERE i.visible_from <= p_now AND i.run_id = ANY(p_told) GROUP BY i.run_id
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
                LIMIT cardinality(p_told)
            ) c
            WHERE NOT c.needs_key
            ORDER BY c.priority DESC, c.created_at, c.position;
        END IF; END IF;

        IF p_claim THEN
            RETURN QUERY
            WITH claimable AS (
                SELECT t.queue, t.task_id FROM {s}.activity_tasks t
                WHERE t.state = 'QUEUED' AND t.name = ANY(p_names)
                  AND (t.locked_until IS NULL OR t.locked_until <= p_now)
                  AND t.queue IN (SELECT qu.name FROM {s}.queues qu WHERE qu.kind = 'activity' AND NOT qu.paused)
                ORDER BY t.priority DESC, t.task_id
                LIMIT p_limit
                FOR UPDATE OF t SKIP LOCKED
            )
            UPDATE {s}.activity_tasks t
            SET attempt = t.attempt + CASE WHEN t.locked_by IS NULL THEN 0 ELSE 1 END,
                locked_by = p_owner, locked_until = p_now + least(t.lock_timeout, p_lease),
                lock_version = t.lock_version + 1
            FROM claimable c WHERE t.queue = c.queue AND t.task_id = c.task_id
            RETURNING t.task_id, t.run_id, t.created_seq, t.name, t.input, t.queue, t.priority, t.attempt,
                t.retry_policy, t.lock_timeout, t.locked_by, t.locked_until, t.lock_version, t.trace_context;
        END IF;
    END
    $$
    """,
)
