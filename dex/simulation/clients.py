"""The simulated application: a client that starts runs and sends requests to live ones.

It starts up to ``max_runs`` runs of the workload, sends events to runs that listen for them,
and cancels, suspends and resumes runs that accept requests, through an engine that does no
work of its own (as an application thread does). The simulator (``simulator.py``) weighs its
actions against the nodes' and the clock's, all drawn from the one seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import dex
from dex.app.ports.store import RunRecord
from dex.domain.errors import InvalidStateError
from dex.domain.status import RunStatus
from dex.simulation.referee import Referee
from dex.simulation.workload import Workload

Action = tuple[float, str, Callable[[], str | None]]  # (weight, "who what", the step itself)


class Clients:
    """Starts runs and sends events and requests, as the seeded generator chooses."""

    def __init__(
        self, engine: dex.Engine, referee: Referee, workload: Workload, rng: random.Random, max_runs: int
    ) -> None:
        self._engine, self._referee, self._workload, self._rng = engine, referee, workload, rng
        self._max_runs = max_runs
        self.started = 0

    def actions(self) -> list[Action]:
        live = {
            run_id: record
            for run_id, record in self._referee.statuses.last.items()
            if run_id not in self._referee.statuses.deleted and not record.status.is_terminal
        }
        actions: list[Action] = []
        if self.started < self._max_runs:
            actions.append((2.0, "client start", self._start))
        if live:
            actions += [
                (1.5, "client send-event", lambda: self._send_event(live)),
                (0.08, "client cancel", lambda: self._request(live, "cancel", None)),
                (0.3, "client suspend", lambda: self._request(live, "suspend", RunStatus.RUNNING)),
            ]
        if any(r.status is RunStatus.SUSPENDED for r in live.values()):
            actions.append((1.0, "client resume", lambda: self._request(live, "resume", RunStatus.SUSPENDED)))
        return actions

    def _start(self) -> str:
        self.started += 1
        run_id = self._workload.start(self._engine, self._rng, self.started)
        return f"{self._referee.runs[run_id].workflow_name} {run_id[:8]}"

    def _send_event(self, live: dict[str, RunRecord]) -> str:
        listening = sorted(r for r, record in live.items() if self._workload.listens(record.workflow_name))
        run_id = self._rng.choice(listening or sorted(live))
        event = self._workload.event_for(self._referee.runs[run_id].workflow_name, self._rng)
        if event is None:
            return f"none for {run_id[:8]}"
        self._engine.send_event(run_id, *event)
        return f"{event[0]}={event[1]!r} to {run_id[:8]}"

    def _request(self, live: dict[str, RunRecord], what: str, status: RunStatus | None) -> str:
        candidates = sorted(
            run_id
            for run_id, r in live.items()
            if (status is None or r.status is status) and self._workload.accepts_requests(r.workflow_name)
        )
        if not candidates:
            return "no candidate"
        run_id = self._rng.choice(candidates)
        try:
            getattr(self._engine, what)(run_id)
        except InvalidStateError as exc:
            return f"{run_id[:8]} refused: {exc}"
        return run_id[:8]
