"""The schema's migrations, in order: released history, one frozen module per version.

Each module ``m<N>_<what>.py`` holds ``VERSION`` and ``STATEMENTS``, the SQL texts applied
for it, written out in full. A released migration is never edited and imports nothing, not
even constants of the live code (``schema.LIVE``, a function's text): those may change, and a
database made with the old text must stay what it was. A change of schema is a new module
appended to :data:`MIGRATIONS`, with a new version number and a line in the frozen checksums
of ``tests/unit/test_migrations_frozen.py`` and a regenerated ``tests/integration/schema_snapshot.txt``.

In the texts, ``{s}`` stands for the schema, which the runner
(:func:`dex.adapters.postgres.schema.migrate`) fills in as a quoted identifier; it also swaps
the ``$$`` quotes of function bodies for a dollar tag that the schema's name does not contain.
Nothing else about a text changes when it is applied.
"""

from __future__ import annotations

from dex.adapters.postgres.migrations import (
    m1_tables,
    m2_trace_context,
    m3_no_foreign_keys,
    m4_create_run,
    m5_history_blocks,
    m6_schedules,
    m7_code_versions,
    m8_forks,
    m9_complete_activities,
    m10_activity_attempts,
    m11_child_runs,
    m12_engines,
    m13_run_endings,
    m14_id_reuse,
    m15_queue_limits,
    m16_updates,
    m17_outbox,
    m18_streams,
    m19_start_shares,
)

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = tuple(
    (module.VERSION, module.STATEMENTS)
    for module in (
        m1_tables,
        m2_trace_context,
        m3_no_foreign_keys,
        m4_create_run,
        m5_history_blocks,
        m6_schedules,
        m7_code_versions,
        m8_forks,
        m9_complete_activities,
        m10_activity_attempts,
        m11_child_runs,
        m12_engines,
        m13_run_endings,
        m14_id_reuse,
        m15_queue_limits,
        m16_updates,
        m17_outbox,
        m18_streams,
        m19_start_shares,
    )
)
LATEST_VERSION = MIGRATIONS[-1][0]

__all__ = ["LATEST_VERSION", "MIGRATIONS"]
