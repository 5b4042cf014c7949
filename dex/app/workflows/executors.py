"""What a workflow task starts from: the executor of the run's previous task, kept in a cache,
and the history after it; or, when none is kept (or it no longer stands where the stored history
ends), the whole history, replayed.

Executors hold live coroutines: one that is dropped is closed by the worker, by the end of its
round, replay-silent (docs/reference/contract.md §8), never left to the garbage collector, whose closing would run
its code's ``finally`` blocks as if live. Every close goes through the worker's
:class:`Closer`, because closing runs workflow code (its ``except`` and ``finally`` blocks),
which may misbehave like any workflow code:

- it may refuse to stop (catch the close and await again, for ever): such a coroutine is given
  up after a few throws (``dex.domain.coroutines.CLOSE_THROWS``), and the closer counts, logs
  and reports it (``Engine.health().abandoned_executors``, ``dex_abandoned_executors_total``);
- it may block (a CPU loop in a ``finally``): so executors are not closed where they are
  dropped — the flusher evicting from the cache, the watchdog handing a round over, an
  activity's thread answering a step — but queued, and closed by the workflow worker at the
  start and end of its rounds, each close watched like any stretch of workflow code
  (``dex.app.machinery.watchdog``). The flusher never runs workflow code, and a close that blocks is
  interrupted and its thread replaced; the engine's ``stop()`` closes what is left in a thread
  of its own, for at most its timeout.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime

import attrs

from dex.app.ports.store import Loaded, Store, WorkflowTask
from dex.app.ports.telemetry import Telemetry, TelemetryHub
from dex.domain import events as ev
from dex.domain.replay import WorkflowExecutor
from dex.domain.task import InboxMessage, WorkflowTaskResult

log = logging.getLogger("dex.worker")


@attrs.frozen(kw_only=True)
class Cached:
    """An executor kept for its run's next task, and the sequence number it stands at (the
    last history event it has applied)."""

    executor: WorkflowExecutor
    last_seq: int


@attrs.frozen(kw_only=True)
class Given:
    """A task's input that is already at hand (loaded with its claim, or by its round), and
    the time it was loaded at: the time the task is decided at."""

    loaded: Loaded
    at: datetime


@attrs.frozen(kw_only=True)
class Preloaded:
    """What a round hands ``WorkflowWorker.execute``: the executor taken from the cache for the
    task's run (None: none was kept) and the task's input."""

    cached: Cached | None
    given: Given


@attrs.frozen(kw_only=True)
class Job:
    """A task of a round not yet started, with what it starts from."""

    task: WorkflowTask
    preloaded: Preloaded


class Round:
    """A round's tasks not yet started (each with its cached executor and input) and its
    results decided so far: shared, so the watchdog can hand them to another thread."""

    def __init__(self) -> None:
        self.jobs: deque[Job] = deque()
        self.done: list[tuple[WorkflowTask, WorkflowTaskResult]] = []
        # decided up to a transaction step that the round's next group runs (dex.app.workflows.step_groups);
        # each is a whole result as it is: written now, it makes the step a task of its own
        self.parked: list[tuple[WorkflowTask, WorkflowTaskResult]] = []

    def take(self) -> list[tuple[WorkflowTask, WorkflowTaskResult]]:
        """What the round decided (its parked results too), taken out of it."""
        taken, self.done, self.parked = self.done + self.parked, [], []
        return taken


class Unwritten:
    """The executors of results decided but not yet applied by the store, by claim (task id,
    lease version: a node may hold two claims of one task): cached only once the store has
    applied the result, because until then another node may redo the task and record other side
    effects at the same sequence numbers."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], Cached] = {}
        self._lock = threading.Lock()

    def get(self, task: WorkflowTask) -> Cached | None:
        with self._lock:
            return self._entries.get((task.task_id, task.lease.version))

    def put(self, task: WorkflowTask, executor: WorkflowExecutor, last_seq: int) -> None:
        with self._lock:
            self._entries[(task.task_id, task.lease.version)] = Cached(executor=executor, last_seq=last_seq)

    def pop(self, task: WorkflowTask) -> Cached | None:
        with self._lock:
            return self._entries.pop((task.task_id, task.lease.version), None)

    def clear(self) -> list[Cached]:
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        return entries


class Closer:
    """Closes the executors a workflow worker drops, and counts the coroutines that refused to
    close (abandoned: see the module docstring). One per worker, shared by its cache."""

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self._telemetry: Telemetry = telemetry if telemetry is not None else TelemetryHub()
        self._abandoned = 0
        self._dropped: list[WorkflowExecutor] = []  # to be closed by the workflow worker's thread
        self._lock = threading.Lock()

    @property
    def abandoned(self) -> int:
        """Coroutines that refused to close, abandoned so far (by this worker)."""
        return self._abandoned

    def __len__(self) -> int:
        """How many dropped executors wait to be closed."""
        return len(self._dropped)

    def __call__(self, executor: WorkflowExecutor) -> None:
        """``executor`` is dropped: queue it for :meth:`close_dropped` (from any thread; no code
        runs here). One whose code has ended (a finished run's, commonly) is closed at once: that
        runs none of its code, and frees it now rather than after the round (its objects would
        otherwise outlive the round, and the garbage collector would walk them again and again)."""
        if executor.code_ended:
            self._close(executor)
            return
        with self._lock:
            self._dropped.append(executor)

    def all(self, executors: Iterable[WorkflowExecutor]) -> None:
        """Each of ``executors`` is dropped (see ``__call__``)."""
        executors = list(executors)
        with self._lock:
            self._dropped.extend(executors)

    def close_dropped(self, watched: Callable[[WorkflowExecutor], AbstractContextManager[object]] | None = None) -> int:
        """Close the executors dropped so far, each inside ``watched(executor)`` (the workflow
        worker's watch, when a watchdog runs); return how many."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
        for executor in dropped:
            if watched is None:
                self._close(executor)
            else:
                with watched(executor):
                    self._close(executor)
        return len(dropped)

    def _close(self, executor: WorkflowExecutor) -> None:
        """Close ``executor`` (silently: its code issues nothing); one that fails to close is logged."""
        try:
            refused = executor.close()
        except Exception:
            log.exception("closing the executor of run %s failed", executor.run_id)
            return
        if not refused:
            return
        with self._lock:
            self._abandoned += refused
        log.warning(
            "the workflow code of run %s (%s) refused to stop when its executor was closed (it caught the "
            "close and awaited again): %d coroutine(s) abandoned; the run goes on from a replay",
            executor.run_id,
            executor.workflow_name,
            refused,
            extra={"run_id": executor.run_id, "workflow_name": executor.workflow_name},
        )
        hook = getattr(self._telemetry, "executors_abandoned", None)  # sinks written before it lack it
        if hook is not None:
            hook(executor.workflow_name, refused)


class ExecutorCache:
    """Executors of recently advanced runs, so a run's next task applies only what is new.

    An entry is valid only for the history it was advanced to (``last_seq``); a task that
    finds the run's history elsewhere, or a result of ours the store discarded, drops it.
    Bounded (least recently used first out), because each entry holds live coroutines.
    """

    def __init__(self, capacity: int, close: Closer | None = None) -> None:
        self._capacity = capacity
        self._close = close if close is not None else Closer()
        self._entries: OrderedDict[str, Cached] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, run_id: str) -> Cached | None:
        """Remove and return the executor cached for ``run_id`` and the sequence number it stands at."""
        with self._lock:
            return self._entries.pop(run_id, None)

    def put(self, run_id: str, executor: WorkflowExecutor, last_seq: int) -> None:
        evicted = []
        with self._lock:
            if self._capacity <= 0:
                evicted.append(executor)
            else:
                replaced = self._entries.pop(run_id, None)
                if replaced is not None and replaced.executor is not executor:
                    evicted.append(replaced.executor)  # another executor of the run: dropped, so closed
                self._entries[run_id] = Cached(executor=executor, last_seq=last_seq)
                while len(self._entries) > self._capacity:
                    evicted.append(self._entries.popitem(last=False)[1].executor)
        if evicted:
            self._close.all(evicted)

    def give_back(self, run_id: str, lent: Cached) -> None:
        """Return an executor that was taken to answer a query (``engine.query``): kept again
        unless the run's task has cached another meanwhile, which is newer (then it is closed)."""
        with self._lock:
            if run_id not in self._entries and self._capacity > 0:
                self._entries[run_id] = lent
                return
        self._close(lent.executor)

    def positions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The sequence number each cached run's executor stands at (runs not cached are left out)."""
        with self._lock:
            return {run_id: self._entries[run_id].last_seq for run_id in run_ids if run_id in self._entries}

    def discard(self, run_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(run_id, None)
        if entry is not None:
            self._close(entry.executor)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), OrderedDict()
        self._close.all(entry.executor for entry in entries)


def round_inputs(
    store: Store,
    cache: ExecutorCache,
    handed: Sequence[tuple[WorkflowTask, Given | None]],
    give_back: Callable[[WorkflowTask, Exception], bool],
    close: Closer,
) -> list[Job]:
    """The jobs of a round: each task with its cached executor (taken from ``cache``) and its
    input, the given one or, for those that came without it, loaded in one round trip (the
    tails after cached executors, else whole histories). If that load fails, its tasks are
    handed to ``give_back`` while it takes them (see :func:`_given_back`)."""
    now = store.clock.now()
    cached = [cache.take(task.run_id) for task, _given in handed]
    try:
        requests = [
            (task, entry.last_seq if entry is not None else 0)
            for (task, given), entry in zip(handed, cached, strict=True)
            if given is None
        ]
        fresh: Iterator[Loaded] = iter([])
        if requests:
            try:
                fresh = iter(store.load_workflow_tasks(requests, now))
            except Exception as exc:  # noqa: BLE001 - the store failed the load: the tasks, not the runs
                fresh = _given_back([task for task, _after in requests], exc, give_back)
        return [
            Job(
                task=task,
                preloaded=Preloaded(
                    cached=entry, given=given if given is not None else Given(loaded=next(fresh), at=now)
                ),
            )
            for (task, given), entry in zip(handed, cached, strict=True)
        ]
    except BaseException:
        # a dropped executor is closed by the worker, replay-silent (docs/reference/contract.md §8): left to the garbage
        # collector, its code's finally blocks would run as if live
        close.all(entry.executor for entry in cached if entry is not None)
        raise


def _given_back(
    tasks: Sequence[WorkflowTask], exc: Exception, give_back: Callable[[WorkflowTask, Exception], bool]
) -> Iterator[Loaded]:
    """The load of a round failed: give its tasks back (``retry_later``) while the store takes
    them; once it does not, the rest lapse with their leases (a retry all the same, without
    a call per task to a store that is down). Yields, per task, the error to skip it by."""
    giving_back = True
    for task in tasks:
        if giving_back:
            giving_back = give_back(task, exc)
        yield GivenBack(task.task_id)


class GivenBack(Exception):
    """Stands for the input of a task whose round failed to load it: the task was given back."""


def start_point(
    store: Store, cache: ExecutorCache, task: WorkflowTask, now: datetime, preloaded: Preloaded | None, close: Closer
) -> tuple[WorkflowExecutor | None, int, list[ev.HistoryEvent], list[InboxMessage]]:
    """The cached executor if the stored history still ends where it stands, else the full history."""
    if preloaded is not None:
        cached, item = preloaded.cached, preloaded.given.loaded
    else:
        cached = cache.take(task.run_id)
        try:
            item = store.load_workflow_tasks([(task, cached.last_seq if cached else 0)], now)[0]
        except BaseException:
            if cached is not None:
                close(
                    cached.executor
                )  # dropped: closed by the worker, not by the garbage collector (docs/reference/contract.md §8)
            raise
    if isinstance(item, Exception):
        if cached is not None:
            close(cached.executor)
        raise item
    if cached is not None:
        tail = item.events
        if len(tail) == 1 and tail[0].sequence_number == cached.last_seq:
            return cached.executor, cached.last_seq, [], item.inbox
        close(cached.executor)  # someone else moved the run on (or our last result was refused)
    history, inbox = item.events, item.inbox
    if not history or history[0].sequence_number != 1:
        # a tail, loaded for an executor that does not stand there now: it was closed just
        # above, or it left the bounded cache after the claim that loaded the tail for it
        # (Claim.after_seqs); a history loaded from the start is used as it is
        history, inbox = store.load_workflow_task(task, now)
    return None, history[-1].sequence_number, history, inbox
