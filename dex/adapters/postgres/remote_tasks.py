"""The PostgreSQL adapter's reads for remote workers (SPEC §13): a claimed activity task found
by its id alone, for the complete, fail and heartbeat calls of a worker in another language.

Part of :class:`dex.adapters.postgres.PostgresAdapter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import psycopg

from dex.adapters.postgres import activity_tasks
from dex.adapters.postgres.schema import Statements
from dex.app.ports import ActivityTask


class PostgresRemoteTasks:
    """The remote workers' reads of the PostgreSQL adapter (a part of it: it uses the adapter's
    connections and statements)."""

    _q: Statements

    def _statement(self, kept: bool = False) -> AbstractContextManager[psycopg.Connection]:
        raise NotImplementedError  # the adapter's

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        with self._statement() as conn:
            return activity_tasks.find_activity_tasks(conn, self._q, task_ids)
