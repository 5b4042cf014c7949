"""The PostgreSQL adapter: psycopg 3, a connection pool, one partition per task queue.

``PostgresAdapter(dsn, schema="dex")`` implements every port the engine needs; ``migrate``
creates or upgrades the schema (the adapter calls it on construction); ``embedded_dsn()`` starts
(or reuses) a local server for development, tests and scripts (the ``embedded`` extra).
"""

from dex.adapters.postgres.adapter import PostgresAdapter
from dex.adapters.postgres.connection import DatabaseConnectionError, InvalidDsnError
from dex.adapters.postgres.embedded import embedded_dsn
from dex.adapters.postgres.migrations import LATEST_VERSION
from dex.adapters.postgres.schema import DatabasePermissionError, migrate, schema_version

__all__ = [
    "LATEST_VERSION",
    "DatabaseConnectionError",
    "DatabasePermissionError",
    "InvalidDsnError",
    "PostgresAdapter",
    "embedded_dsn",
    "migrate",
    "schema_version",
]
