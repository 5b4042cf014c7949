"""The store port of starts whose ``instance_id`` may name an ended or a waiting run
(docs/reference/contract.md §15: ``id_reuse`` and ``debounce``).

A plain start (``id_reuse="allow"``, no debounce) stays on ``create_run``, the start path's one
statement; only a start with a :class:`~dex.domain.instance_keys.StartRule` that looks further
comes here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from dex.domain import events as ev
from dex.domain.instance_keys import StartRule


class KeyedStarts(Protocol):
    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        """Start a run whose ``created.instance_id`` is set, under ``rule``: find the id's latest
        run (the live one, else the newest that retention kept), then do what
        :func:`dex.domain.instance_keys.decide` says — return that run's id, create the run
        ``run_id`` (its ``RunStarted`` due at the decision's time), or give the waiting run the
        new arguments and start time — and return the id of the run that answers the start.

        The lookup and the write are one step for every start of the same instance id, on any
        engine: two starts racing under ``"never"`` make one run. With ``connection`` (the
        application's transaction, never committed here; PostgreSQL only, TypeError elsewhere)
        the instance id stays held until that transaction ends."""
        ...
