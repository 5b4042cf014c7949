"""Benchmarks for dex (and DBOS Transact for comparison): ``python -m benchmarks.run``.

See BENCHMARKS.md for the figures and how they were measured.
"""
