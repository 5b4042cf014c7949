"""The ``dex`` command line (click): workers, runs, events, queues, migrations and the demo.

``main`` is the console script; ``cli`` is the click group, for embedding or testing. The
modules: ``main`` (root group, demo, migrate, error reporting), ``database`` (which database,
shared options), ``runs`` (runs and events), ``queues``, ``engines`` (the live engines),
``schedules``, ``worker``, ``replay``,
``web``, ``dev`` (an embedded PostgreSQL and the dashboard for development) and ``params``
(argument types); tables, JSON and timelines are :mod:`dex.views`.
"""

from dex.cli.main import cli, main

__all__ = ["cli", "main"]
