"""The run status machine of docs/reference/contract.md §5."""

from __future__ import annotations

import enum

from dex.domain.errors import InvalidStateError


class RunStatus(enum.Enum):
    """Where a run is in its life. The last four are terminal."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # the hard stop of docs/reference/contract.md §14: no workflow code ran to end it
    TERMINATED = "TERMINATED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TERMINATED})

ALLOWED_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.CREATED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TERMINATED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUSPENDED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TERMINATED}
    ),
    RunStatus.SUSPENDED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TERMINATED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.TERMINATED: frozenset(),
}


def can_transition(current: RunStatus, target: RunStatus) -> bool:
    """Whether docs/reference/contract.md §5 allows ``current -> target``."""
    return target in ALLOWED_TRANSITIONS[current]


def transition(current: RunStatus, target: RunStatus) -> RunStatus:
    """Return ``target`` if the move is legal, else raise :class:`InvalidStateError`."""
    if not can_transition(current, target):
        raise InvalidStateError(f"a run cannot go from {current.value} to {target.value}")
    return target


def requested(current: RunStatus, target: RunStatus) -> RunStatus:
    """A transition an application requests (``cancel``, ``suspend``, ``resume``): ``target``
    if legal, else :class:`InvalidStateError`. ``resume`` moves only a SUSPENDED run: CREATED
    -> RUNNING is the run starting, which its first workflow task records, not a request."""
    if target is RunStatus.RUNNING and current is not RunStatus.SUSPENDED:
        raise InvalidStateError(f"a run cannot be resumed from {current.value}: only a SUSPENDED run can")
    return transition(current, target)
