"""What keeps the leases of a worker's running activity attempts (:mod:`dex.app.activities.leases` decides,
this does it): extensions sent through the write buffer, attempts past their ``lock_timeout``
failed, and attempts whose runs were cancelled or ended told so (docs/reference/contract.md §13). The engine's
activity thread calls :meth:`LeaseKeeper.keep` every round; an attempt's ``heartbeat()`` comes
here from the attempt's own thread (or its event loop's)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dex.app.activities.leases import ActivityLeases
from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import ActivityOutcome, ActivityTask, Store

log = logging.getLogger("dex.worker")


class LeaseKeeper:
    """Keeps the leases of the attempts in ``leases`` through ``buffer``; ``timed_out`` makes the
    outcome of an attempt that ran past its deadline."""

    def __init__(
        self,
        store: Store,
        buffer: ResultBuffer,
        leases: ActivityLeases,
        timed_out: Callable[[ActivityTask], ActivityOutcome],
    ) -> None:
        self._store, self._buffer, self._leases, self._timed_out = store, buffer, leases, timed_out

    def heartbeat(self, task: ActivityTask) -> bool:
        """The attempt's ``heartbeat()``: moves its deadline (``lock_timeout`` from now) and
        extends its lease at once; False once the lease is lost or given up, or the run was
        cancelled or ended (``cancel_requested``)."""
        if self._leases.cancelled(task) or not self._leases.heartbeat(task, self._store.clock.now()):
            return False
        if self._buffer.heartbeat(task):
            return True
        self._cancel(task)  # the lease is lost: the attempt is told so
        return False

    def keep(self) -> int:
        """Queue the extensions of the running attempts' leases when due, fail the attempts past
        their ``lock_timeout`` (leases.py), and, about once a second, tell the attempts whose
        runs were cancelled or ended. How many leases it extended or failed."""
        now = self._store.clock.now()
        decided = self._leases.step(now)
        for task in decided.extend:
            if not self._buffer.heartbeat(task):
                self._cancel(task)
        self._tell_cancelled(self._leases.due_checks(now))
        for task in decided.overdue:
            log.warning(
                "activity %s of run %s, attempt %d: still running after its lock_timeout (%s); failed,"
                " and whatever it returns will be discarded",
                task.name,
                task.run_id,
                task.attempt,
                task.lock_timeout,
                extra={"run_id": task.run_id, "activity_name": task.name, "attempt": task.attempt},
            )
            self._buffer.add_activity_outcome(self._timed_out(task))
        return len(decided.extend) + len(decided.overdue)

    def _cancel(self, task: ActivityTask) -> None:
        # what it returns from now on is discarded by the store's lease check: its lease is lost,
        # or its task went with its run
        self._leases.cancel(task)

    def _tell_cancelled(self, tasks: tuple[ActivityTask, ...]) -> None:
        """Cancel the attempts whose runs were cancelled or ended (or are gone)."""
        if not tasks:
            return
        try:
            runs = self._store.get_runs(sorted({t.run_id for t in tasks}))
        except Exception:
            log.info("could not read the runs of the running activities", exc_info=True)
            return
        live = {run.run_id for run in runs if not run.status.is_terminal}
        for task in tasks:
            if task.run_id not in live:
                self._cancel(task)
