"""benchmarks.server_cpu reads PostgreSQL's log_statement_stats entries and sums them per statement."""

from __future__ import annotations

import pytest

from benchmarks.server_cpu import statement_cpu

# Three entries as PostgreSQL 16 writes them (one per protocol message), with the DETAIL and
# STATEMENT lines that carry timestamps of their own, and an ordinary LOG line between them.
LOG = """\
2026-11-23 15:40:08.148 UTC [5632] LOG:  BIND MESSAGE STATISTICS
2026-11-23 15:40:08.148 UTC [5632] DETAIL:  ! system usage stats:
\t!\t0.000080 s user, 0.000020 s system, 0.000150 s elapsed
\t!\t[0.002720 s user, 0.000000 s system total]
2026-11-23 15:40:08.148 UTC [5632] STATEMENT:  SELECT * FROM "bench_cpu_0a1b2c3d".runs
\t WHERE run_id = $1
2026-11-23 15:40:08.149 UTC [5632] LOG:  EXECUTE MESSAGE STATISTICS
2026-11-23 15:40:08.149 UTC [5632] DETAIL:  ! system usage stats:
\t!\t0.000300 s user, 0.000100 s system, 0.000500 s elapsed
\t!\t[0.003020 s user, 0.000000 s system total]
2026-11-23 15:40:08.149 UTC [5632] STATEMENT:  SELECT * FROM "bench_cpu_0a1b2c3d".runs WHERE run_id = $1
2026-11-23 15:40:08.150 UTC [5554] LOG:  checkpoint starting: time
2026-11-23 15:40:08.151 UTC [5633] LOG:  QUERY STATISTICS
2026-11-23 15:40:08.151 UTC [5633] DETAIL:  ! system usage stats:
\t!\t0.000010 s user, 0.000000 s system, 0.000300 s elapsed
2026-11-23 15:40:08.151 UTC [5633] STATEMENT:  COMMIT
"""


def test_entries_are_summed_per_statement_without_the_schema() -> None:
    totals = statement_cpu(LOG)
    assert set(totals) == {"SELECT * FROM runs WHERE run_id = $1", "COMMIT"}
    messages, cpu, elapsed = totals["SELECT * FROM runs WHERE run_id = $1"]
    assert messages == 2
    assert cpu == pytest.approx(0.0005)  # user + system of both messages
    assert elapsed == pytest.approx(0.00065)
    assert totals["COMMIT"] == (1, pytest.approx(0.00001), pytest.approx(0.0003))


def test_a_log_without_statistics_gives_nothing() -> None:
    assert statement_cpu("2026-11-23 15:40:08.150 UTC [5554] LOG:  checkpoint starting: time\n") == {}
