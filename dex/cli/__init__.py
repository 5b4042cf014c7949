"""The ``dex`` command line (click): workers, runs, events, queues, migrations and the demo.

``main`` is the console script; ``cli`` is the click group, for embedding or testing. The
modules: ``main`` (root group, demo, migrate, error reporting), ``database`` (which database,
shared options), ``runs`` (runs and events), ``queues``, ``worker``, ``params`` (argument
types), ``render`` (tables and JSON) and ``timeline`` (``runs show``).
"""

from dex.cli.main import cli, main

__all__ = ["cli", "main"]
