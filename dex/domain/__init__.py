"""The pure core of dex: events, commands, run state machine, replay and retry policy.

Nothing in this package performs I/O, reads the wall clock or uses global randomness:
time, seeds and payload conversion come in as arguments. It imports only the standard
library, attrs and itself (``tests/unit/test_layering.py`` keeps it so).
"""
