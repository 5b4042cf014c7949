"""Migration 11 (released): an index of child runs by their parent, newest first.

Frozen: this text is what databases at version 11 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

``list_runs`` with ``parent_run_id`` (a run's children, as the dashboard's runs list shows
them under their parent and counts them) reads this index instead of every run. It holds
child runs only: most runs have no parent, and they cost nothing here.
"""

VERSION = 11

STATEMENTS: tuple[str, ...] = (
    "CREATE INDEX runs_children ON {s}.runs (parent_run_id, created_at DESC, position DESC)"
    " WHERE parent_run_id IS NOT NULL",
)
