"""The simulated application: a client that starts runs and sends requests to live ones.

It starts up to ``max_runs`` runs of the workload, sends events to runs that listen for them,
and cancels, suspends and resumes runs that accept requests, through an engine that does no
work of its own (as an application thread does). For a workload whose runs take updates it
also sends updates — straight to the store, as an engine without the workflow's code does, so
no call drives a run — and reads their answers as a caller waiting for them would; and it
cancels the runs the workload says to cancel often. (Those actions exist only for such a
workload: the others' seeds draw exactly as before.) The simulator (``simulator.py``) weighs its
actions against the nodes' and the clock's, all drawn from the one seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import dex
from dex.app.ports.store import RunRecord
from dex.domain.errors import InvalidStateError
from dex.domain.handlers import update_request
from dex.domain.status import RunStatus
from dex.domain.task import UpdateAnswer
from dex.domain.values import FailureInfo
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
        self._updates = 0
        self._sent: dict[str, tuple[str, tuple[object, ...]]] = {}  # each update id: its name and arguments

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
        if any(self._workload.takes_updates(r.workflow_name) for r in live.values()):
            actions.append((2.0, "client update", lambda: self._update(live)))
        if any(self._workload.cancels_often(r.workflow_name) for r in live.values()):
            actions.append((0.25, "client cancel-often", lambda: self._cancel_often(live)))
        if self._referee.awaiting:
            actions.append((1.0, "client answers", self._answers))
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

    def _update(self, live: dict[str, RunRecord]) -> str:
        """Send an update to a run that takes them: a new one, or (now and then) an id sent before,
        with what it was sent with (the caller trying again)."""
        run_id = self._rng.choice(
            sorted(r for r, rec in live.items() if self._workload.takes_updates(rec.workflow_name))
        )
        log = self._referee.runs[run_id]
        if log.updates and self._rng.random() < 0.2:
            update_id = self._rng.choice(sorted(log.updates))
            name, args = self._sent[update_id]
        else:
            self._updates += 1
            update_id = f"u{self._updates}"
            name, args = self._workload.update_for(self._rng)
            self._sent[update_id] = (name, args)
        converter = self._engine.converter
        request = update_request(update_id, name, tuple(converter.encode(arg) for arg in args))
        store = self._engine.store
        answer: UpdateAnswer | None
        try:
            answer = store.request_update(run_id, request, store.clock.now())
        except InvalidStateError as exc:  # the run has ended: the caller is told at the call
            failure = FailureInfo(type="InvalidStateError", message=str(exc), terminal=True)
            answer = UpdateAnswer(update_id=update_id, failure=failure, rejected=True)
        self._referee.update_sent(run_id, update_id, answer)
        said = "waits" if answer is None else "refused" if answer.rejected else "answered at once"
        return f"{update_id} {name}{args!r} to {run_id[:8]}: {said}"

    def _answers(self) -> str:
        return f"{self._referee.collect_answers(self._engine.store)} answered"

    def _cancel_often(self, live: dict[str, RunRecord]) -> str:
        run_id = self._rng.choice(
            sorted(r for r, rec in live.items() if self._workload.cancels_often(rec.workflow_name))
        )
        try:
            self._engine.cancel(run_id)
        except InvalidStateError as exc:
            return f"{run_id[:8]} refused: {exc}"
        return run_id[:8]

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
