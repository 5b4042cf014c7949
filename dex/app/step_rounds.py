"""How a workflow round's tasks that reach a transaction step go on (:mod:`dex.app.step_groups`).

A part of :class:`~dex.app.workflow_worker.WorkflowWorker`. A result that waits on a step that
may run in a group is *parked* instead of done; once the round has decided its tasks, the
parked ones go on group after group — in a started engine's group threads, so that the round
decides its next tasks meanwhile, else in the round's own thread — until each is done, and
their results go to the buffer as the round's do. A parked result is a whole result as it is:
written, it makes its step a task of its own; that is what happens to it when the group
threads are closed (the engine stops) or its executor is gone.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING

from dex.app.buffer import ResultBuffer
from dex.app.executors import Closer, Round, Unwritten
from dex.app.inline import InlineActivities
from dex.app.ports import AnsweredStep, Store, WorkflowTask
from dex.app.registry import Registry
from dex.app.step_groups import GroupThreads, Parked, StepGroups
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import WorkflowTaskResult

if TYPE_CHECKING:
    from dex.app.watchdog import Watchdog

log = logging.getLogger("dex.worker")


class GroupedSteps:
    """Parking results at transaction steps and running them on (see the module docstring)."""

    _store: Store
    _registry: Registry
    _lease: timedelta
    _buffer: ResultBuffer
    _handed_lock: threading.Lock
    _unwritten: Unwritten
    closer: Closer
    watchdog: Watchdog | None
    inline: InlineActivities | None
    steps: StepGroups | None
    _groups: GroupThreads | None

    def _watched(self, task: WorkflowTask, executor: WorkflowExecutor | None) -> AbstractContextManager[None]:
        raise NotImplementedError  # the worker's

    def _drop(self, task: WorkflowTask) -> None:
        raise NotImplementedError  # the worker's

    def run_inline(self, inline: InlineActivities | None, groups: GroupThreads | None = None) -> None:
        """Run first attempts of short activities inside their tasks (None: never), and short
        transaction steps in groups (:mod:`dex.app.step_groups`), in ``groups``' threads if given."""
        self.inline, self.steps, self._groups = inline, None, groups
        if inline is not None:
            self.steps = StepGroups(self._store, inline, self._registry, self._store.clock, self._lease)

    def _decided(self, round_: Round, task: WorkflowTask, result: WorkflowTaskResult) -> None:
        """A result of the round: done, or parked at a step its next group runs."""
        entry = self._unwritten.get(task)
        # an answered step is written as it is (its write is what ends the activity's claim):
        # a transaction step it schedules becomes a task of its own
        parks = (
            self.steps is not None
            and entry is not None
            and not isinstance(task, AnsweredStep)
            and self.steps.waits(task, entry.executor, result)
        )
        with self._handed_lock:
            (round_.parked if parks else round_.done).append((task, result))

    def _go_on(self, round_: Round) -> None:
        """The round's parked tasks go on: in the group threads, or here."""
        groups = self._groups
        if groups is None or not round_.parked:
            return self._run_steps(round_)
        apart = Round()
        with self._handed_lock:
            apart.parked, round_.parked = round_.parked, []
        if not groups.submit(lambda: self._run_apart(apart)):
            with self._handed_lock:  # written as they are: their steps become tasks
                round_.done.extend(apart.take())
        return None

    def _run_apart(self, round_: Round) -> None:
        try:
            self._run_steps(round_)
        except BaseException:  # a bug of ours: the tasks being decided are retried after their leases
            log.exception("transaction steps in a group could not go on; their tasks are retried")
        finally:
            done = round_.take()
            if done:
                self._buffer.add_workflow_results(done)

    def _run_steps(self, round_: Round) -> None:
        """Run the round's parked steps, group after group, until every task is done."""
        while self.steps is not None and round_.parked:
            with self._handed_lock:
                batch, round_.parked = round_.parked, []
            entries = [(task, result, self._unwritten.get(task)) for task, result in batch]
            parked = [Parked(task=t, executor=e.executor, result=r) for t, r, e in entries if e is not None]
            with self._handed_lock:  # (none): written as they are
                round_.done.extend((t, r) for t, r, e in entries if e is None)
            for item, result in self.steps.run(parked, self._watched):
                task, executor = item.task, item.executor
                if result is None or (self.watchdog is not None and self.watchdog.abandoned(task)):
                    self._drop(task)  # no longer ours, or given up while its code blocked
                    continue
                if executor.finished or result.new_history is not None:
                    self._unwritten.pop(task)
                    self.closer(executor)
                elif result.new_events:
                    self._unwritten.put(task, executor, result.new_events[-1].sequence_number)
                self._decided(round_, task, result)
