"""Migration 17 (released): the outbox of the Kafka dispatch mode (docs/reference/contract.md §16).

Frozen: this text is what databases at version 17 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

One row per task made claimable while the database is in Kafka mode, written by a trigger in
the transaction that made the task (so a task and its notice commit or roll back together),
read in ``id`` order and deleted by the leader's relay once the broker acknowledged it. The
trigger functions are made here; the triggers themselves are created by an engine started with
``dispatch="kafka"`` and dropped by one started with ``dispatch="polling"``, so a database that
never used Kafka has no trigger at all and its task inserts run exactly as before.
An activity task is announced when it becomes claimable (``state = 'QUEUED'``): inserted so,
or moved there by the activity scheduler (a first attempt that waited for room, a retry).
"""

VERSION = 17

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.outbox (
        id          bigserial PRIMARY KEY,
        kind        text NOT NULL CHECK (kind IN ('workflow', 'activity')),
        queue       text COLLATE "C" NOT NULL,
        task_id     bigint NOT NULL,
        run_id      text COLLATE "C" NOT NULL,
        name        text COLLATE "C" NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE FUNCTION {s}.outbox_workflow_task() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO {s}.outbox (kind, queue, task_id, run_id, name)
        VALUES ('workflow', NEW.queue, NEW.task_id, NEW.run_id, NEW.workflow_name);
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE FUNCTION {s}.outbox_activity_task() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO {s}.outbox (kind, queue, task_id, run_id, name)
        VALUES ('activity', NEW.queue, NEW.task_id, NEW.run_id, NEW.name);
        RETURN NULL;
    END
    $$
    """,
)
