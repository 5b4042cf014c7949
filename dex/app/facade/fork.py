"""``Engine.fork`` (docs/reference/contract.md §11): a new run that goes on from a point of another run's history.

What a fork copies and what it starts again is the domain's (:mod:`dex.domain.forks`); this
module's :class:`Forks` (the service behind the engine's call) reads the original, checks the
fork point, and has the store create the fork in one write (``RunStore.create_fork``), so a
fork that fails leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable

from dex.app.facade.reads import run_id_of
from dex.app.machinery.threads import Foreground
from dex.app.ports.ids import new_run_id
from dex.app.ports.store import Store
from dex.domain.definitions import validate_queue
from dex.domain.errors import RunNotFoundError
from dex.domain.forks import fork_point, plan_fork


class Forks:
    """Forks the runs of ``store``.

    Each fork records ``code_version``; ``started`` is told each fork made (its id), as a
    start tells it; ``nudge_scheduler`` wakes the scheduler of a started engine.
    """

    def __init__(
        self,
        store: Store,
        *,
        code_version: str | None,
        foreground: Foreground,
        started: Callable[[str], None],
        nudge_scheduler: Callable[[], None],
    ) -> None:
        self._store = store
        self._code_version = code_version
        self._foreground = foreground
        self._started = started
        self._nudge_scheduler = nudge_scheduler

    def fork(self, run_id: str, at: int | None = None, queue: str | None = None) -> str:
        """Start a new run of ``run_id``'s workflow and input whose history is the original's up
        to ``at`` (the sequence number of a ``WorkflowTaskCompleted``, or 1: from the start;
        default: the end of the last workflow task before the run ended, for a live run its
        last one), and return its id (``RunInfo.forked_from`` names the original).

        The steps recorded up to there are not repeated; those pending there (activities,
        timers, children) are started again, and the events the original received after it
        are delivered again (see :mod:`dex.domain.forks` and
        docs/how-to/deploy-new-code.md). ``queue`` puts the fork on another workflow queue. A fork keeps the original's
        instance id: InvalidStateError while a live run holds it. RunNotFoundError for an
        unknown run, TypeError or ValueError for a bad ``at`` or ``queue``; nothing is written
        then.
        """
        run_id = run_id_of(run_id)
        if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
            raise TypeError(f"at must be an int (a sequence number of the history) or None, got {type(at).__name__}")
        queue = validate_queue(queue) if queue is not None else None
        with self._foreground.calling():
            if self._store.get_run(run_id) is None:
                raise RunNotFoundError(f"no run with id {run_id!r}")  # as get_run says it
            history = self._store.load_history(run_id)
            point = fork_point(history, at, run_id)
            now = self._store.clock.now()
            # the fork records this engine's code version; the command line's engine names
            # none, and then the fork keeps the original's
            fork = plan_fork(
                history,
                point,
                run_id=new_run_id(),
                forked_from=run_id,
                queue=queue,
                code_version=self._code_version,
                now=now,
            )
            fork_id = self._store.create_fork(fork, now)
        self._started(fork_id)
        self._nudge_scheduler()  # its activity tasks and due messages wait for the scheduler
        return fork_id
