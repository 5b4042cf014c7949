"""The engine's own Python per workflow, without a database: ``python -m benchmarks.decide_path``.

What the workflow worker and the flusher do in Python for one fresh three-activity run, in
one thread: the run's first workflow task decided from ``[RunCreated]`` and ``[RunStarted]``
(replay, ``advance``), its three activities run inline (``continue_task`` after each), and the
task's sixteen history events encoded as the one history block the flush writes. The clock
is this process's CPU time, best of several rounds, so the figure repeats to a fraction of a
microsecond on an idle machine, where the throughput batch moves by ten percent: a tool for
comparing two versions of that code, not a benchmark part.
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import UTC, datetime, timedelta

import dex
from benchmarks.workloads import ACTIVITIES, WORKFLOWS
from dex.adapters.memory import InMemoryAdapter
from dex.adapters.postgres.rows import history_row
from dex.app.ports.ids import new_run_id
from dex.app.ports.store import Lease, WorkflowInput, WorkflowTask
from dex.app.workflows.executors import Given, Preloaded
from dex.app.workflows.inline import InlineActivities, QueueView
from dex.app.workflows.worker import Started
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage
from dex.testing import VirtualClock

WORKFLOW = "bench-three"


class DecidePath:
    """A workflow worker with inline activities, as a started engine lends them, fed fresh
    runs of ``bench-three`` directly (no store round trips)."""

    def __init__(self) -> None:
        adapter = InMemoryAdapter(clock=VirtualClock())
        self.engine = dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES)
        self.worker = self.engine.workflow_worker
        activities = self.engine.activity_worker
        # a generous bound on what runs inline: every attempt here does, however slowly this
        # process runs (under a profiler, or a loaded machine, 5 ms was exceeded and the run
        # took the ordinary path: no result to time)
        inline = InlineActivities(
            activities, QueueView(adapter.activity_slots), self.engine.node_id, 60.0, threading.Event()
        )
        self.started = Started(inline=inline)
        for name in self.engine.registry.activities:  # as if each had run once: inline from the start
            activities.durations.record(name, 1e-5)
        self.now = datetime.now(UTC)

    def tasks(self, n: int) -> list[tuple[WorkflowTask, Preloaded]]:
        lease = Lease(owner=self.engine.node_id, until=self.now + timedelta(minutes=1), version=1)
        made = []
        for i in range(n):
            run_id = new_run_id()
            created = ev.RunCreated(
                workflow_name=WORKFLOW, input=(self.engine.converter.encode(i),), queue="default", random_seed=i
            )
            task = WorkflowTask(task_id=i, run_id=run_id, workflow_name=WORKFLOW, queue="default", lease=lease)
            history = [ev.HistoryEvent(sequence_number=1, timestamp=self.now, event=created)]
            loaded = WorkflowInput(events=history, inbox=[InboxMessage(message_id=i, event=ev.RunStarted())])
            # what the worker's round hands ``execute``: no cached executor, the input, its time
            made.append((task, Preloaded(cached=None, given=Given(loaded=loaded, at=self.now))))
        return made

    def run(self, n: int) -> float:
        """Decide and encode ``n`` fresh runs; seconds of this process's CPU per run."""
        made = self.tasks(n)
        started = time.process_time()
        for task, preloaded in made:
            result = self.worker.execute(task, preloaded=preloaded, started=self.started)
            assert result is not None and result.completion is not None
            history_row(task.run_id, result.new_events)
        seconds = time.process_time() - started
        self.worker.forget()  # the decided runs' executors, kept for writes that never come
        return seconds / n

    def check(self) -> None:
        """One run ends COMPLETED with the three-activity workflow's sixteen events and result."""
        ((task, preloaded),) = self.tasks(1)
        result = self.worker.execute(task, preloaded=preloaded, started=self.started)
        assert result is not None and result.completion is not None
        if result.completion.status is not RunStatus.COMPLETED or len(result.new_events) != 16:
            raise AssertionError(
                f"unexpected result of {WORKFLOW}: {result.completion}, {len(result.new_events)} events"
            )
        self.worker.forget()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="runs per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best counts (default 7)")
    args = parser.parse_args()
    path = DecidePath()
    path.check()
    path.run(200)  # warm-up
    best = min(path.run(args.n) for _ in range(args.rounds))
    print(
        f"decide and encode one three-activity run: {best * 1e6:.1f} us of CPU (best of {args.rounds} rounds of {args.n})"
    )


if __name__ == "__main__":
    main()
