"""Migration 8 (released): forks (docs/reference/contract.md §11) — the run a run was forked from.

Frozen: this text is what databases at version 8 were made with. It imports nothing; never
edit it (a change of schema is a new migration). ``{s}`` is the schema, filled in by the
runner as a quoted identifier.

``forked_from`` is the id of the run whose history a fork copied (``Engine.fork``), NULL for
every other run. It is read with the run and never searched by, so it has no index.
"""

VERSION = 8

STATEMENTS: tuple[str, ...] = ('ALTER TABLE {s}.runs ADD COLUMN forked_from text COLLATE "C"',)
