"""Workflows this process no longer runs: code the watchdog could not stop.

The watchdog (:mod:`dex.app.machinery.watchdog`) gives a blocked workflow task back and interrupts its
thread, which ends a ``time.sleep`` when it returns and a Python loop at once. Some code is
beyond its reach, and would do it again on every retry, for ever:

- code that swallows the interrupt (``except BaseException`` around its loop) goes on spinning
  in its thread, which the watchdog has replaced: each retry leaves one more such thread;
- C code that holds the GIL (a catastrophic regular expression) stops every thread of the
  process — the other runs, the store's writes, the watchdog itself — until it returns, and
  the interrupt cannot land inside it;
- code that blocks its task each time it is retried.

So the watchdog reports every task it had to give up, and every interrupted thread, here; and a
workflow (by name) whose code went beyond its reach is *quarantined* in this process: its tasks
are no longer claimed by it, a task of it already handed to this process is given back with the
usual backoff (``WorkflowWorker.retry_later``), never lost — another process runs it, or this
one after a restart. Logged once (ERROR), listed in ``Engine.health().quarantined_workflows``
and the ``dex_workflow_quarantined`` metric. A workflow is quarantined when

- its tasks were blocked past the deadline ``after`` times (3) in this process;
- ``threads`` (2) of its threads go on running after their interrupt, at once;
- its code held the GIL past the deadline: the watchdog could not run meanwhile, and the
  blocked thread had the CPU (one such task already froze the whole process once).

Quarantine lasts as long as the process (an engine stopped and started again keeps it): the
code that misbehaved is the same until a deployment restarts the process.
"""

from __future__ import annotations

import logging
import threading

from dex.app.ports.telemetry import Telemetry, TelemetryHub

log = logging.getLogger("dex.watchdog")

BLOCKS = 3
"""Tasks of one workflow given up by the watchdog before the workflow is quarantined."""
SPINNING = 2
"""Threads of one workflow still running after their interrupt before it is quarantined."""


class Quarantine:
    """Which workflows this process no longer runs, and the threads their code still holds."""

    def __init__(self, telemetry: Telemetry | None = None, *, after: int = BLOCKS, threads: int = SPINNING) -> None:
        self._telemetry: Telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._after, self._threads = after, threads
        self._blocks: dict[str, int] = {}  # by workflow name: tasks given up by the watchdog
        self._interrupted: dict[int, str] = {}  # by thread: the workflow whose code it still runs
        self._names: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    @property
    def names(self) -> frozenset[str]:
        """The workflows quarantined in this process."""
        return self._names

    def holds(self, workflow: str) -> bool:
        return workflow in self._names

    @property
    def interrupted_threads(self) -> int:
        """Threads the watchdog interrupted that still run workflow code."""
        return len(self._interrupted)

    def blocked(self, workflow: str, run_id: str, beyond_reach: str | None = None) -> None:
        """A task of ``workflow`` (of run ``run_id``) blocked its thread past the deadline;
        ``beyond_reach`` says why no retry in this process could end better (it held the GIL)."""
        with self._lock:
            self._blocks[workflow] = blocks = self._blocks.get(workflow, 0) + 1
        if beyond_reach is not None:
            self._quarantine(workflow, run_id, beyond_reach)
        elif blocks >= self._after:
            self._quarantine(workflow, run_id, f"its tasks were blocked past the deadline {blocks} times")

    def interrupted(self, thread: int, workflow: str, run_id: str) -> None:
        """The watchdog interrupted ``thread``, running code of ``workflow``, and it runs on."""
        with self._lock:
            self._interrupted[thread] = workflow
            spinning = sum(name == workflow for name in self._interrupted.values())
            count = len(self._interrupted)
        self._count(count)
        if spinning >= self._threads:
            self._quarantine(
                workflow,
                run_id,
                f"{spinning} of its threads go on running after the watchdog interrupted them "
                "(it swallows the interrupt, or waits in a call that does not return)",
            )

    def ended(self, thread: int) -> None:
        """An interrupted thread left the workflow code."""
        with self._lock:
            if self._interrupted.pop(thread, None) is None:
                return
            count = len(self._interrupted)
        self._count(count)

    def _count(self, count: int) -> None:
        hook = getattr(self._telemetry, "interrupted_threads", None)  # sinks written before it lack it
        if hook is not None:
            hook(count)

    def _quarantine(self, workflow: str, run_id: str, reason: str) -> None:
        with self._lock:
            if workflow in self._names:
                return
            self._names = self._names | {workflow}
        log.error(
            "workflow %s is quarantined in this process: %s (last at run %s); its tasks are left to other "
            "processes (or to this one after a restart)",
            workflow,
            reason,
            run_id,
            extra={"run_id": run_id, "workflow_name": workflow},
        )
        hook = getattr(self._telemetry, "workflow_quarantined", None)
        if hook is not None:
            hook(workflow)
