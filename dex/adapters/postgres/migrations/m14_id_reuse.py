"""Migration 14 (released): the runs of an instance id, newest first (docs/reference/contract.md §15).

Frozen: this text is what databases at version 14 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

A start with ``id_reuse="failed_only"`` or ``"never"`` (or ``debounce``) reads the latest run of
its instance id, ended ones included: this index finds it in one probe, where the partial
unique index ``runs_live_instance`` holds live runs only. No table of keys is kept beside the
runs: the runs are the keys, so retention, which deletes ended runs, frees their ids with them,
and nothing can disagree with the runs themselves. Races between starts of one id are decided
by the instance id's transaction-scoped advisory lock, which every such start takes.

A schedule keeps its ``id_reuse`` (the runs its fires start follow it): existing schedules
read ``allow``, what they did before.
"""

VERSION = 14

STATEMENTS: tuple[str, ...] = (
    "CREATE INDEX runs_instance ON {s}.runs (instance_id, created_at DESC, position DESC)"
    " WHERE instance_id IS NOT NULL",
    "ALTER TABLE {s}.schedules ADD COLUMN id_reuse text NOT NULL DEFAULT 'allow'",
)
