"""What ``Engine.health()`` reports: the engine's threads, and the resources hostile code or
clients can hold (docs/reference/contract.md §8; docs/how-to/operate.md "Health").

Each figure is read from the component that owns it when ``health()`` is called; nothing is
kept here. A figure that is not zero names something an operator should look at: a workflow
coroutine that refused to close, a task thread the watchdog interrupted that still runs, a
transaction step attempt still running after its lease was lost, the remote workers' long polls
at their limit.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen(kw_only=True)
class EngineHealth:
    """An engine's health. ``threads`` is empty when the engine is not started; the other figures
    belong to the engine object and outlive a ``stop()`` (an abandoned coroutine, a thread still
    spinning or a quarantine does not end with the engine's threads)."""

    threads: Mapping[str, bool] = attrs.field(factory=dict)
    """Each engine thread, by name: alive (True) or dead (False). A dead one is replaced."""
    abandoned_executors: int = 0
    """Workflow coroutines that did not close when dropped (they caught the close), abandoned."""
    interrupted_threads: int = 0
    """Workflow task threads the watchdog interrupted that have not ended (still spinning)."""
    quarantined_workflows: tuple[str, ...] = ()
    """Workflow names this process no longer runs: their code blocked tasks beyond the watchdog."""
    lost_step_slots: int = 0
    """Transaction step attempts still running after their lease was lost (stuck in their own
    code past their ``lock_timeout``: their session was ended, their slot given to the next
    step, and what they return will be dropped)."""
    long_polls_open: int = 0
    """Remote workers' long polls open now (``/v1/activity-tasks/poll``, gRPC ``Poll``)."""
    long_polls_limit: int = 0
    """How many long polls may be open at once; 0 when no remote-worker service is attached."""
    dispatch: str = "polling"
    """How the engine's workers learn of tasks: ``"polling"`` or ``"kafka"`` (``Engine(dispatch=)``)."""
    notices: Mapping[str, object] = attrs.field(factory=dict)
    """In the Kafka mode, since the engine was made: tasks ``claimed`` by notice, notices
    ``skipped`` by reason (``stale``, ``already-claimed``, ``no-room``, ``malformed``,
    ``other-queue``, ``other-name``), ``lock_conflicts``, notices ``published`` by this engine's relay, and as of
    its last relay round (while it leads) ``outbox_depth`` and ``relay_lag_seconds``. Empty in
    the polling mode."""

    @property
    def threads_alive(self) -> bool:
        """Every engine thread is alive (True when not started)."""
        return all(self.threads.values())

    @property
    def ok(self) -> bool:
        """Nothing to look at: every thread alive, nothing stuck, held or saturated."""
        saturated = self.long_polls_limit > 0 and self.long_polls_open >= self.long_polls_limit
        return (
            self.threads_alive
            and not self.abandoned_executors
            and not self.interrupted_threads
            and not self.quarantined_workflows
            and not self.lost_step_slots
            and not saturated
        )
