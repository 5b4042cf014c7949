"""Task notices: the opt-in event-driven dispatch (``Engine(dispatch="kafka")``), as the engine sees it.

In the default mode (``dispatch="polling"``) workers find their tasks by claiming from the task
tables. In the event-driven mode the store also writes a *notice* for each task that becomes
claimable, in the transaction that made it; a relay on the leader publishes the notices to a
message broker and deletes those the broker acknowledged, and every engine receives the
notices of its queues and claims exactly the tasks they name, under their lease as before. The
task's row stays the truth: a notice is only a hint where to look, so a notice delivered twice,
or for a task already taken, claims nothing (it is skipped and counted), and a task whose notice
was lost is still found by a slow poll of the task tables.

:class:`TaskNotices` is that mode's port, built by the adapter that supports it
(:class:`NoticeSource`); the memory adapter does not (the mode needs PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Generic, Protocol, TypeVar, runtime_checkable

import attrs

from dex.app.ports.store import ActivityTask, Claim, WorkflowTask

POLLING = "polling"
KAFKA = "kafka"
DISPATCH_MODES = (POLLING, KAFKA)

T = TypeVar("T", WorkflowTask, ActivityTask)


@attrs.frozen(kw_only=True)
class TaskNotice:
    """A task made claimable: which (``kind``, ``queue``, ``task_id``), of which run, for which
    name, and when its notice was written (for the dispatch latency)."""

    kind: str  # "workflow" or "activity"
    queue: str
    task_id: int
    run_id: str
    name: str
    created_at: datetime


@attrs.frozen(kw_only=True)
class Received:
    """What one receive got: the notices for this engine, and how many messages were skipped
    before any claim, by reason ("malformed", "other-queue", "other-name")."""

    notices: tuple[TaskNotice, ...] = ()
    skipped: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class NoticeClaims(Generic[T]):
    """The tasks a batch of notices claimed, and of the notices that claimed nothing: those
    whose task another worker held at that moment (``conflicts``) and those whose task was gone
    or not claimable (``stale``: done already, a duplicate, paused)."""

    tasks: tuple[T, ...] = ()
    conflicts: int = 0
    stale: int = 0


@attrs.frozen(kw_only=True)
class RelayReport:
    """One relay round: notices published (and deleted), notices deleted unpublished because
    their task was already claimed or gone, notices the broker refused (kept for the next
    round), the outbox rows left, and the age in seconds of the oldest of them (the relay lag)."""

    published: int = 0
    dropped: int = 0
    refused: int = 0
    depth: int = 0
    lag: float = 0.0

    @property
    def more(self) -> bool:
        """The round took a full batch: the next should follow at once."""
        return self.depth > 0 and self.refused == 0


class TaskNotices(Protocol):
    """The broker and the outbox of one engine in the event-driven mode. ``open`` before use
    (``Engine.start``), ``close`` after (``Engine.stop``); the other calls may raise on a fault
    of the broker or the store, which fails only that round (the engine's thread backs off)."""

    safety_poll: float
    """Seconds between the slow polls of the task tables that find tasks whose notice was lost."""
    relay_interval: float
    """Seconds between the relay's reads of an empty outbox."""

    def open(
        self, workflow_queues: Collection[str], activity_queues: Collection[str], names: Collection[str] = ()
    ) -> None:
        """Connect; subscribe to the topics of these queues (created if missing), for these names."""
        ...

    def close(self) -> None: ...

    def relay(self, now: datetime) -> RelayReport:
        """Publish a batch of the outbox, oldest first; delete what the broker acknowledged."""
        ...

    def receive(self, timeout: float) -> Received:
        """Wait up to ``timeout`` seconds for notices of the subscribed queues."""
        ...

    def received(self) -> None:
        """Everything received so far is handled: the broker may forget it (commit)."""
        ...

    def rewind(self) -> None:
        """The last receive was not handled (the store failed): receive it again."""
        ...

    def claim_workflow_tasks(
        self, notices: Sequence[TaskNotice], claim: Claim, now: datetime
    ) -> NoticeClaims[WorkflowTask]: ...

    def claim_activity_tasks(
        self, notices: Sequence[TaskNotice], claim: Claim, now: datetime
    ) -> NoticeClaims[ActivityTask]: ...


@runtime_checkable
class NoticeSource(Protocol):
    """A store that can run the event-driven mode (the PostgreSQL adapter)."""

    def set_dispatch(self, mode: str) -> None:
        """Make the database write notices (``"kafka"``) or not (``"polling"``): a restart's
        switch of every engine on it."""
        ...

    def task_notices(self, config: Mapping[str, object]) -> TaskNotices:
        """The mode's notices over a broker configured by ``config`` (checked here)."""
        ...
