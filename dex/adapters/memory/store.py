"""InMemoryAdapter: every port of :mod:`dex.app.ports.store` over Python dicts.

One re-entrant lock serialises all operations, which makes each one atomic just as a
transaction is in PostgreSQL. Iteration orders are fixed (priority, then id), so the same
calls in the same order give the same results: the simulator and hypothesis rely on that.

The adapter is composed of parts that share the tables (``state.py``) and receive what else
they use in their constructors: runs and messages (``runs.py``), keyed starts
(``instance_keys.py``), the task queues
(``tasks.py``), forks (``forks.py``), schedules (``schedules.py``), queue administration and
leadership (``queues.py``), the engine registry (``engines.py``), transaction steps
(``steps.py``), update answers (``updates.py``) and published values and streams (``streams.py``). It builds them, holds them,
and implements each port by one call of the part that owns it — except the ports that are
made of others: the batches (``send_messages``, ``load_workflow_tasks``) and eager dispatch (a
write, then a claim, under the one lock), which it composes from its own ports, as schedules
start runs and steps complete through them. So a subclass that wraps a port (the simulator's
observer, the tests' broken stores) sees every use of it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from dex.adapters.memory import storable
from dex.adapters.memory.at_call import MemoryEndings
from dex.adapters.memory.engines import MemoryEngines
from dex.adapters.memory.forks import MemoryForks
from dex.adapters.memory.instance_keys import MemoryKeyedStarts
from dex.adapters.memory.queues import MemoryQueues
from dex.adapters.memory.runs import MemoryRuns
from dex.adapters.memory.schedules import MemorySchedules
from dex.adapters.memory.state import MemoryState
from dex.adapters.memory.steps import MemorySteps
from dex.adapters.memory.streams import MemoryStreams
from dex.adapters.memory.tasks import MemoryTasks
from dex.adapters.memory.updates import MemoryUpdates
from dex.app.ports.clock import SystemClock
from dex.app.ports.endings import Decide
from dex.app.ports.engines import EngineInfo
from dex.app.ports.schedules import ScheduleAdvance, ScheduleDefinition, ScheduledStart, ScheduleRecord
from dex.app.ports.store import (
    ActivityOutcome,
    ActivitySlots,
    ActivityTask,
    Claim,
    Clock,
    Loaded,
    QueueInfo,
    RunFilter,
    RunRecord,
    StepAttempts,
    StepEndings,
    TransactionStep,
    WorkflowInput,
    WorkflowTask,
)
from dex.app.ports.streams import PublishedRead, RunStreams, StreamPage
from dex.app.ports.transactions import CheckpointOutcome, StepCheckpoint
from dex.domain import events as ev
from dex.domain.errors import DexError, InvalidStateError, RunNotFoundError
from dex.domain.forks import Fork
from dex.domain.instance_keys import StartRule
from dex.domain.queue_limits import RateLimit
from dex.domain.status import RunStatus
from dex.domain.task import InboxMessage, UpdateAnswer, WorkflowTaskResult
from dex.domain.values import FailureInfo, Payload


class InMemoryAdapter:
    """A complete, deterministic store in process memory. Several engines may share one.

    ``clock`` gives the time of the steps' completions (engines pass their times to every
    other call); ``transaction_connection`` is a function returning a DB-API connection for
    transaction steps (``@dex.transaction``), a stand-in for the database's own."""

    def __init__(self, clock: Clock | None = None, *, transaction_connection: Callable[[], Any] | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._state = state = MemoryState()
        self._runs = MemoryRuns(state)
        self._keyed = MemoryKeyedStarts(state)
        self._tasks = MemoryTasks(state)
        self._endings = MemoryEndings(state, self._tasks)
        self._forks = MemoryForks(state, self._tasks)
        self._schedules = MemorySchedules(state, self.create_run, self.start_keyed_run)
        self._queues = MemoryQueues(state)
        self._engines = MemoryEngines(state)
        self._updates = MemoryUpdates(state)
        self._streams = MemoryStreams(state)
        self._steps = MemorySteps(state, self._tasks, self._clock, transaction_connection, self.complete_activity_tasks)

    @property
    def clock(self) -> Clock:
        return self._clock

    def close(self) -> None:
        pass

    # -- runs ------------------------------------------------------------------------------
    def create_run(self, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        return self._runs.create_run(run_id, created, now)

    def create_run_then_claim(
        self, run_id: str, created: ev.RunCreated, now: datetime, claim: Claim
    ) -> tuple[str, list[WorkflowTask], list[Loaded]]:
        with self._state.lock:
            got = self.create_run(run_id, created, now)
            if got != run_id:
                return got, [], []  # a live run holds the instance id: nothing new to claim
            return got, *self._runs.claim_new_run(run_id, created, now, claim)

    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        return self._keyed.start_keyed_run(run_id, created, now, rule, connection)

    def get_run(self, run_id: str) -> RunRecord | None:
        return self._runs.get_run(run_id)

    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        return self._runs.get_runs(run_ids)

    def list_runs(self, run_filter: RunFilter) -> list[RunRecord]:
        return self._runs.list_runs(run_filter)

    def load_history(self, run_id: str) -> list[ev.HistoryEvent]:
        return self._runs.load_history(run_id)

    def load_history_after(self, run_id: str, after_seq: int, limit: int) -> list[ev.HistoryEvent]:
        return self._runs.load_history_after(run_id, after_seq, limit)

    def history_bounds(self, run_id: str) -> tuple[int, int]:
        return self._runs.history_bounds(run_id)

    def send_message(self, run_id: str, message: ev.Message, now: datetime) -> None:
        self._runs.send_message(run_id, message, now)

    def send_messages(self, items: Sequence[tuple[str, ev.Message]], now: datetime) -> list[DexError | None]:
        storable.messages(items)  # before anything changes: the batch is all or nothing
        with self._state.lock:
            errors: list[DexError | None] = []
            for run_id, message in items:
                try:
                    self.send_message(run_id, message, now)
                except (RunNotFoundError, InvalidStateError) as exc:
                    errors.append(exc)
                else:
                    errors.append(None)
            return errors

    def request_transition(self, run_id: str, target: RunStatus, message: ev.Message, now: datetime) -> None:
        self._runs.request_transition(run_id, target, message, now)

    # -- update answers (docs/reference/contract.md §14) --------------------------------------------------
    def request_update(self, run_id: str, request: ev.UpdateRequested, now: datetime) -> UpdateAnswer | None:
        return self._updates.request_update(run_id, request, now)

    def request_update_then_claim(
        self, run_id: str, request: ev.UpdateRequested, now: datetime, claim: Claim
    ) -> tuple[UpdateAnswer | None, list[WorkflowTask], list[Loaded]]:
        with self._state.lock:
            answer = self.request_update(run_id, request, now)
            if answer is not None:
                return answer, [], []
            self.schedule_workflow_tasks(now, _DISPATCH_BATCH)
            claimed = self.claim_workflow_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)
            after = claim.after_seqs or {}
            return None, claimed, self.load_workflow_tasks([(t, after.get(t.run_id, 0)) for t in claimed], now)

    def update_answer(self, run_id: str, update_id: str) -> UpdateAnswer | None:
        return self._updates.update_answer(run_id, update_id)

    def wait_update_answer(self, run_id: str, update_id: str, timeout: float) -> UpdateAnswer | None:
        return self._updates.wait_update_answer(run_id, update_id, timeout)

    def delete_finished_runs(self, completed_before: datetime, limit: int) -> int:
        return self._runs.delete_finished_runs(completed_before, limit)

    def end_run(self, run_id: str, decide: Decide, now: datetime) -> bool:
        return self._endings.end_run(run_id, decide, now)

    def create_fork(self, fork: Fork, now: datetime) -> str:
        return self._forks.create_fork(fork, now)

    # -- workflow tasks ----------------------------------------------------------------------
    def schedule_workflow_tasks(self, now: datetime, limit: int) -> int:
        return self._tasks.schedule_workflow_tasks(now, limit)

    def claim_workflow_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[WorkflowTask]:
        return self._tasks.claim_workflow_tasks(names, owner, now, lease, limit)

    def load_workflow_task(
        self, task: WorkflowTask, now: datetime, after_seq: int = 0
    ) -> tuple[list[ev.HistoryEvent], list[InboxMessage]]:
        return self._tasks.load_workflow_task(task, now, after_seq)

    def load_workflow_tasks(self, requests: Sequence[tuple[WorkflowTask, int]], now: datetime) -> list[Loaded]:
        with self._state.lock:
            loaded: list[Loaded] = []
            for task, after_seq in requests:
                try:
                    events, inbox = self.load_workflow_task(task, now, after_seq)
                    loaded.append(WorkflowInput(events=events, inbox=inbox))
                except RunNotFoundError as exc:
                    loaded.append(exc)
            return loaded

    def complete_workflow_tasks(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime
    ) -> list[bool]:
        return self._tasks.complete_workflow_tasks(results, now)

    def complete_workflow_tasks_then_claim(
        self, results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[ActivityTask]]:
        with self._state.lock:
            applied = self.complete_workflow_tasks(results, now)
            if not any(result.activity_tasks for (_task, result), ok in zip(results, applied, strict=True) if ok):
                return applied, []
            self.schedule_activity_tasks(now, _DISPATCH_BATCH)
            return applied, self.claim_activity_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)

    def retry_workflow_tasks(
        self, retries: Sequence[tuple[WorkflowTask, datetime]], now: datetime, failure: FailureInfo | None = None
    ) -> list[bool]:
        return self._tasks.retry_workflow_tasks(retries, now, failure)

    # -- activity tasks ------------------------------------------------------------------------
    def schedule_activity_tasks(self, now: datetime, limit: int) -> int:
        return self._tasks.schedule_activity_tasks(now, limit)

    def claim_activity_tasks(
        self, names: Collection[str], owner: str, now: datetime, lease: timedelta, limit: int
    ) -> list[ActivityTask]:
        return self._tasks.claim_activity_tasks(names, owner, now, lease, limit)

    def step_attempts(self, run_id: str, created_seqs: Collection[int] | None = None) -> list[StepAttempts]:
        return self._tasks.step_attempts(run_id, created_seqs)

    def step_endings(self, run_id: str, created_seqs: Collection[int], after_seq: int, limit: int) -> StepEndings:
        return self._runs.step_endings(run_id, created_seqs, after_seq, limit)

    def find_activity_tasks(self, task_ids: Sequence[int]) -> list[ActivityTask | None]:
        return self._tasks.find_activity_tasks(task_ids)

    def extend_activity_leases(self, tasks: Sequence[ActivityTask], now: datetime, lease: timedelta) -> list[bool]:
        return self._tasks.extend_activity_leases(tasks, now, lease)

    def complete_activity_tasks(self, outcomes: Sequence[ActivityOutcome], now: datetime) -> list[bool]:
        return self._tasks.complete_activity_tasks(outcomes, now)

    def complete_activity_tasks_then_claim(
        self, outcomes: Sequence[ActivityOutcome], now: datetime, claim: Claim
    ) -> tuple[list[bool], list[WorkflowTask], list[Loaded]]:
        with self._state.lock:
            applied = self.complete_activity_tasks(outcomes, now)
            if not any(ok and outcome.retry_at is None for outcome, ok in zip(outcomes, applied, strict=True)):
                return applied, [], []
            self.schedule_workflow_tasks(now, _DISPATCH_BATCH)
            claimed = self.claim_workflow_tasks(claim.names, claim.owner, now, claim.lease, claim.limit)
            if claim.after_seqs is None:
                return applied, claimed, []
            after = claim.after_seqs
            return applied, claimed, self.load_workflow_tasks([(t, after.get(t.run_id, 0)) for t in claimed], now)

    # -- transaction steps ---------------------------------------------------------------------
    @property
    def lost_step_slots(self) -> int:
        return self._steps.lost_step_slots

    def complete_in_transaction(self, step: TransactionStep) -> bool:
        return self._steps.complete_in_transaction(step)

    def checkpoint_steps(self, items: Sequence[StepCheckpoint], now: datetime) -> list[CheckpointOutcome]:
        return self._steps.checkpoint_steps(items, now)

    def create_run_in(self, connection: object, run_id: str, created: ev.RunCreated, now: datetime) -> str:
        return self._steps.create_run_in(connection, run_id, created, now)

    def send_message_in(self, connection: object, run_id: str, message: ev.Message, now: datetime) -> None:
        self._steps.send_message_in(connection, run_id, message, now)

    # -- schedules -----------------------------------------------------------------------------
    def create_schedule(self, record: ScheduleRecord) -> None:
        self._schedules.create_schedule(record)

    def update_schedule(
        self, definition: ScheduleDefinition, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        self._schedules.update_schedule(definition, next_fire_at, due_at)

    def delete_schedule(self, name: str) -> None:
        self._schedules.delete_schedule(name)

    def set_schedule_paused(
        self, name: str, paused: bool, note: str, next_fire_at: datetime | None, due_at: datetime | None
    ) -> None:
        self._schedules.set_schedule_paused(name, paused, note, next_fire_at, due_at)

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        return self._schedules.get_schedule(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        return self._schedules.list_schedules()

    def due_schedules(self, now: datetime, limit: int) -> tuple[list[ScheduleRecord], datetime | None]:
        return self._schedules.due_schedules(now, limit)

    def advance_schedule(self, advance: ScheduleAdvance, now: datetime) -> tuple[bool, str | None]:
        return self._schedules.advance_schedule(advance, now)

    def trigger_schedule(self, name: str, start: ScheduledStart, now: datetime) -> str:
        return self._schedules.trigger_schedule(name, start, now)

    # -- queues, leadership and maintenance -----------------------------------------------------
    def ensure_queue(self, name: str, kind: str, capacity: int = 100) -> None:
        self._queues.ensure_queue(name, kind, capacity)

    def create_queue(
        self, name: str, kind: str, capacity: int, key_concurrency: int = 1, rate_limit: RateLimit | None = None
    ) -> None:
        self._queues.create_queue(name, kind, capacity, key_concurrency, rate_limit)

    def set_queue_paused(self, name: str, kind: str, paused: bool) -> None:
        self._queues.set_queue_paused(name, kind, paused)

    def set_queue_capacity(self, name: str, kind: str, capacity: int) -> None:
        self._queues.set_queue_capacity(name, kind, capacity)

    def set_queue_key_concurrency(self, name: str, kind: str, key_concurrency: int) -> None:
        self._queues.set_queue_key_concurrency(name, kind, key_concurrency)

    def set_queue_rate_limit(self, name: str, kind: str, rate_limit: RateLimit | None) -> None:
        self._queues.set_queue_rate_limit(name, kind, rate_limit)

    def list_queues(self) -> list[QueueInfo]:
        return self._queues.list_queues()

    def activity_slots(self) -> list[ActivitySlots]:
        return self._queues.activity_slots()

    def try_lead(self, node_id: str, now: datetime, ttl: timedelta) -> bool:
        return self._queues.try_lead(node_id, now, ttl)

    def release_leadership(self, node_id: str) -> None:
        self._queues.release_leadership(node_id)

    def next_due_time(self, now: datetime) -> datetime | None:
        return self._queues.next_due_time(now)

    # -- the engine registry ---------------------------------------------------------------
    def heartbeat_engine(self, info: EngineInfo, now: datetime, expires_at: datetime) -> None:
        self._engines.heartbeat_engine(info, now, expires_at)

    def remove_engine(self, node_id: str) -> None:
        self._engines.remove_engine(node_id)

    def list_engines(self, now: datetime) -> list[EngineInfo]:
        return self._engines.list_engines(now)

    # -- published values and streams ---------------------------------------------------------
    def read_published(self, run_id: str, key: str) -> PublishedRead:
        return self._streams.read_published(run_id, key)

    def read_stream(self, run_id: str, key: str, after: int, limit: int) -> StreamPage:
        return self._streams.read_stream(run_id, key, after, limit)

    def run_streams(self, run_id: str) -> RunStreams:
        return self._streams.run_streams(run_id)

    def write_stream_items(self, run_id: str, items: Sequence[tuple[str, Payload]], now: datetime) -> None:
        self._streams.write_stream_items(run_id, items, now)


_DISPATCH_BATCH = 256  # as many as the PostgreSQL adapter schedules inside a completion
