"""The in-memory adapter's keyed starts (docs/reference/contract.md §15: ``id_reuse``, ``debounce``):
the instance id's latest run found and the decision carried out under the state's one lock,
which makes them one step, as the instance id's lock does in PostgreSQL; and the children of
a workflow task's result started under ``id_reuse`` (:func:`start_child`).
Part of :class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tables import RunRow
from dex.domain import events as ev
from dex.domain.instance_keys import Create, Debounce, LatestRun, Reuse, StartRule, decide
from dex.domain.status import RunStatus
from dex.domain.task import NewRun, deadline_message
from dex.domain.writes import instance_clash, reused_outcome

NO_CONNECTION = (
    "connection= needs the PostgreSQL adapter: the in-memory adapter has no database transaction to write through"
)


class MemoryKeyedStarts:
    """:class:`dex.app.ports.instance_keys.KeyedStarts` over the in-memory tables."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        if connection is not None:
            raise TypeError(NO_CONNECTION)
        storable.created(run_id, created)
        if created.instance_id is None:
            raise ValueError("a keyed start needs an instance_id")
        state = self._state
        with state.lock:
            latest = latest_run(state, created.instance_id, now)
            match decide(latest, rule, created.workflow_name, now):
                case Reuse(run_id=existing):
                    return existing
                case Debounce(run_id=waiting, start_at=start_at):
                    self._debounce(state.runs[waiting], created, start_at)
                    return waiting
                case Create(start_at=start_at):
                    state.insert_run(run_id, created, now)
                    if start_at != now:
                        (started,) = state.inbox[run_id]
                        started.visible_from = start_at
                    deadline = deadline_message(run_id, created)
                    if deadline is not None:  # as create_run: the cancel request a deadline makes waits
                        state.push(run_id, deadline.event, deadline.visible_from)
                    return run_id

    def _debounce(self, row: RunRow, created: ev.RunCreated, start_at: datetime) -> None:
        """The waiting run takes the new start's arguments and start time (nothing else of it)."""
        row.created = attrs.evolve(row.created, input=created.input)
        row.history[0] = attrs.evolve(row.history[0], event=row.created)
        for message in self._state.inbox[row.run_id]:
            if isinstance(message.event, ev.RunStarted):
                message.visible_from = start_at


def latest_run(state: MemoryState, instance_id: str, now: datetime) -> LatestRun | None:
    """The live run of ``instance_id`` if any, else its newest (the caller holds the lock)."""
    rows = [row for row in state.runs.values() if row.created.instance_id == instance_id]
    if not rows:
        return None
    live = [row for row in rows if not row.status.is_terminal]
    row = live[0] if live else max(rows, key=lambda r: (r.created_at, r.position))
    return LatestRun(
        run_id=row.run_id,
        workflow_name=row.created.workflow_name,
        status=row.status,
        created_at=row.created_at,
        waiting=_waiting(state, row, now),
    )


def _waiting(state: MemoryState, row: RunRow, now: datetime) -> bool:
    """CREATED, nothing recorded after ``RunCreated``, no task made, its start not yet due,
    nothing else sent to it."""
    if row.status is not RunStatus.CREATED or len(row.history) != 1:
        return False
    if row.run_id in state.workflow_task_of_run:
        return False
    inbox = state.inbox[row.run_id]  # its RunStarted alone: nothing else sent to it
    return len(inbox) == 1 and isinstance(inbox[0].event, ev.RunStarted) and inbox[0].visible_from > now


def start_child(state: MemoryState, parent_run_id: str, child: NewRun, now: datetime) -> None:
    """Make the child run ``child`` of a workflow task's result under its ``rule``, or tell the
    parent what answers instead: the outcome of an ended run of its instance id that the rule
    keeps (:func:`~dex.domain.writes.reused_outcome`), or the clash with a live one (the caller
    holds the lock)."""
    instance_id = child.created.instance_id
    latest = latest_run(state, instance_id, now) if instance_id is not None else None
    match decide(latest, child.rule, child.created.workflow_name, now):
        case Reuse(run_id=existing):
            row = state.runs[existing]
            if row.status.is_terminal:
                state.push(parent_run_id, reused_outcome(child, row.status, row.result, row.failure), now)
            else:
                state.push(parent_run_id, instance_clash(child), now)
        case _:  # a child is never debounced: its rule has none
            state.insert_run(child.run_id, child.created, now)
