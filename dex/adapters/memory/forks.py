"""The in-memory adapter's forks (docs/reference/contract.md §11): a run created from a prefix of another's history.

A started fork is made as the PostgreSQL adapter makes it: the run is created as ``create_run``
creates one (history ``[RunCreated]``, inbox ``[RunStarted]``), a workflow task of its is
claimed, and :meth:`dex.domain.forks.Fork.first_task` is applied as that task's result, by the
very code that applies a worker's result, so the fork's children, activity tasks and timers
are made as any task's are. The checks come first; should applying still fail, every row the
fork added is taken out again, so a fork is all or nothing here as in a transaction. Part of
:class:`dex.adapters.memory.InMemoryAdapter`.
"""

from __future__ import annotations

from datetime import datetime

from dex.adapters.memory import storable
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.tasks import MemoryTasks
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError
from dex.domain.forks import Fork

_FORKER = "dex-fork"  # the owner of the fork's first task, claimed and completed under one lock


class MemoryForks:
    """The fork operation of the in-memory adapter: it applies the fork's first task as the
    task queues apply any result."""

    def __init__(self, state: MemoryState, tasks: MemoryTasks) -> None:
        self._state = state
        self._tasks = tasks

    def create_fork(self, fork: Fork, now: datetime) -> str:
        storable.created(fork.run_id, fork.created)
        storable.text(fork.forked_from, "forked_from")
        storable.workflow_results([(None, fork.first_task(0))])
        with self._state.lock:
            holder = self._state.find_live_instance(fork.created.instance_id)
            if holder is not None:
                raise InvalidStateError(
                    f"instance id {fork.created.instance_id!r} is in use by run {holder}, which is live;"
                    " a fork takes its original's instance id: cancel that run first, or wait for it to end"
                )
            before = self._keys()
            try:
                self._fork(fork, now)
            except BaseException:
                self._undo(before)
                raise
            return fork.run_id

    def _fork(self, fork: Fork, now: datetime) -> None:
        self._state.insert_run(fork.run_id, fork.created, now)
        row = self._state.runs[fork.run_id]
        row.history = [fork.history[0]]  # numbered as the original's (a run that continued as new)
        row.forked_from = fork.forked_from
        if not fork.started:
            return
        (started,) = self._state.inbox[fork.run_id]
        assert isinstance(started.event, ev.RunStarted)
        task = self._state.add_workflow_task(row, fork.created.queue)
        task.lease.take(_FORKER, now)
        if not self._tasks.complete_workflow_task(task.claimed(), fork.first_task(started.message_id), now):
            raise AssertionError(f"the fork {fork.run_id} could not be written")  # pragma: no cover

    def _keys(self) -> tuple[set[str], set[int], set[int]]:
        return set(self._state.runs), set(self._state.workflow_tasks), set(self._state.activity_tasks)

    def _undo(self, before: tuple[set[str], set[int], set[int]]) -> None:
        # a fork only adds rows (its run, its children, their inboxes and tasks): taking out
        # what was not there before leaves the store as the fork found it
        runs, workflow_tasks, activity_tasks = before
        for run_id in set(self._state.runs) - runs:
            del self._state.runs[run_id]
            self._state.inbox.pop(run_id, None)
            self._state.workflow_task_of_run.pop(run_id, None)
        for task_id in set(self._state.workflow_tasks) - workflow_tasks:
            del self._state.workflow_tasks[task_id]
        for task_id in set(self._state.activity_tasks) - activity_tasks:
            del self._state.activity_tasks[task_id]
