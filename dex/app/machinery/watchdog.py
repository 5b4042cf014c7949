"""The watchdog of a started engine: workflow code that blocks its task, and threads that die.

Workflow code must not block (docs/reference/contract.md §8): a ``time.sleep`` or a CPU loop in it holds the
workflow worker's thread, and every run of the process waits behind it; redone after the
task's lease, it would block again, forever. So the workflow worker registers each stretch
of workflow code it runs (:meth:`Watchdog.watch`), and the watchdog, a steppable object
ticked by its own thread, notices one that runs past the deadline
(``Engine(workflow_task_deadline=5)``). It then

- captures where the code is (``sys._current_frames()``: the file, line and stack of the
  blocked thread), and gives the task back with a backoff (``WorkflowWorker.retry_later``),
  logging the run id, the deadline and that place: the task fails, not the run;
- gives the stuck execution up (``WorkflowExecutor.abandon``): whatever the code does when
  it comes back issues nothing and runs no side effect, and its result is discarded;
- raises :class:`WorkflowTaskBlocked` in the blocked thread (``PyThreadState_SetAsyncExc``,
  CPython's public C API), which ends a CPU loop at once and a ``time.sleep`` when it returns;
- retires the blocked thread and starts a fresh one in its place, which takes over the rest
  of the blocked round (``WorkflowWorker.hand_over``), so other runs go on at once. The old
  thread leaves when the blocked call returns.

The close of a dropped executor runs its code's ``finally`` blocks, which may block as well:
the workflow worker closes executors inside a watch too (:meth:`Watchdog.watch_close`), and
one past the deadline is interrupted and its thread replaced the same way, with no task to
give back (the run's next task replays it).

Other runs do not wait for the deadline, though: code that has held its thread for ``stall``
seconds (a second, at most a quarter of the deadline) already has its thread retired and
replaced and the rest of its round handed over, without failing its task — a slow task that
ends before the deadline is written as usual, and the other runs of its round were not held
up by it. At most eight such retired threads may be alive at once (a host so slow that every
task stalls must not breed threads); beyond that, the rest waits for the deadline.

Some code is beyond the reach of all this, and would do it again on every retry:

- code that swallows the interrupt (``except BaseException`` around a CPU loop) spins on in its
  retired thread. The watchdog re-delivers the interrupt every ``stall`` seconds while the
  thread is still in that code, counts such threads (``Engine.health().interrupted_threads``,
  ``dex_interrupted_threads``) and reports them to the quarantine;
- C code that holds the GIL (a catastrophic regular expression: ``re`` never releases it)
  freezes every thread of the process, this one included, until it returns; no interrupt can
  land inside it. The watchdog notices afterwards: its own tick came later than the deadline
  (it could not run), and the blocked thread had the CPU meanwhile. A match that never ends
  freezes the process for good: only a supervisor outside it (a liveness probe) can help;
- code that blocks its task on every retry.

For those, the workflow is quarantined in this process (:mod:`dex.app.machinery.quarantine`): its tasks
are no longer run here, but given back, never lost.

The deadline is half the default workflow-task lease (10 s), so a blocked task is given back
well before its lease would let another worker redo it; Temporal's deadlock detector uses 2 s,
but dex's tasks also replay whole histories, and a long replay on a busy host must not be
mistaken for a block. ``Engine.drain()`` has no watchdog: it steps everything in the caller's
thread, deterministically.

Its second duty: a polling thread that died anyway (none should: their loops survive every
exception) is logged loudly, counted (``Telemetry.thread_died``) and replaced by a fresh one
running the same step — the threads hold no state of their own, so a fresh one carries on
where the dead one stopped, while stopping the engine would stall every run of the process
over one fault. Restarts of one thread are spaced out (doubling up to a minute), so a thread
that dies at once again does not spin. ``Engine.health()`` reports every thread alive or dead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from threading import get_ident as _get_ident
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from dex.app.machinery.quarantine import Quarantine
from dex.app.machinery.threads import PollingThread
from dex.app.ports.store import WorkflowTask
from dex.app.ports.telemetry import Telemetry

if TYPE_CHECKING:
    from dex.domain.replay import WorkflowExecutor

log = logging.getLogger("dex.watchdog")

_DEX = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dex package's directory


class WorkflowTaskBlocked(BaseException):
    """Raised into a thread whose workflow code ran past its task's deadline. A BaseException,
    so that the code's ``except Exception`` does not swallow it; its run does not fail of it
    (the task was given back before, and what the code does afterwards is discarded)."""


class _Watch:
    """One stretch of a task's workflow code in one thread (a context manager: cheap, as it
    wraps every workflow task a started engine runs)."""

    __slots__ = (
        "_dog",
        "cpu",
        "executor",
        "fired",
        "interrupted_at",
        "nested",
        "replaced",
        "run_id",
        "since",
        "spinning",
        "task",
        "thread",
        "workflow",
    )
    # set by __enter__ (thread, since, cpu, nested) or when the watchdog fires (the others)
    thread: int
    since: float
    cpu: float
    nested: bool
    interrupted_at: float
    spinning: bool

    def __init__(
        self, dog: Watchdog, task: WorkflowTask | None, executor: WorkflowExecutor | None, workflow: str, run_id: str
    ) -> None:
        # task None: the close of a dropped executor (no task to give back). Only what every
        # stretch reads is set here: thread, since, cpu and nested by __enter__; interrupted_at
        # and spinning (still running after its interrupt) by the watchdog when it fires
        self._dog = dog
        self.task = task
        self.executor = executor
        self.workflow = workflow
        self.run_id = run_id
        self.fired = False
        self.replaced = False

    def __enter__(self) -> None:
        dog = self._dog
        self.thread = thread = _get_ident()
        self.since = dog._clock()
        # the thread's CPU time since the watchdog's last step (at most), to tell code that held the
        # GIL from code that waited for it: read at the thread's first stretch after each step and
        # kept for its next ones, since reading a thread's clock is a system call (not in the vDSO),
        # measured as the costliest line of a started engine's workflow task; the watchdog's
        # verdict compares it with the process's CPU time since that step
        self.cpu = dog._baselines.read(dog._steps)
        # Without the lock: only this thread adds or removes its own entry, and the watchdog's
        # step reads a copy of the entries (taken under its lock, so no exit removes one while it
        # acts on it); an entry added meanwhile is seen at its next step. Inside a watched
        # stretch already, that one watches this too.
        watches = dog._watches
        self.nested = nested = thread in watches
        if not nested:
            watches[thread] = self

    def __exit__(self, *exc_info: object) -> None:
        if self.nested:
            return
        dog = self._dog
        watches, thread = dog._watches, self.thread
        with dog._lock:  # from here on the watchdog cannot fire on this stretch
            if watches.get(thread) is self:
                del watches[thread]
        if self.fired:
            _clear_interrupt(thread)  # the interrupt may still be pending: it must not land elsewhere
            dog.quarantine.ended(thread)
            return
        held = dog._clock() - self.since
        if held > dog.deadline:  # the watchdog did not get to fire on it
            dog._overran(self, held, time.thread_time() - self.cpu)


class TaskRounds(Protocol):
    """What the watchdog needs of the workflow worker (``dex.app.workflows.worker``), which owns it."""

    def hand_over(self, thread: int) -> int:
        """Give the round ``thread`` runs up to another thread; how many tasks went back."""
        ...

    def retry_later(self, task: WorkflowTask, reason: str) -> bool:
        """Give ``task`` back to be claimed again after a backoff, for ``reason``."""
        ...


class _Baselines(threading.local):
    """Per thread: the watchdog step after which the thread last read its CPU clock, and what it read."""

    def __init__(self) -> None:
        self.step, self.cpu = -1, 0.0

    def read(self, step: int) -> float:
        """The thread's CPU time as read at its first call after watchdog step ``step``."""
        if self.step != step:
            self.step, self.cpu = step, time.thread_time()
        return self.cpu


class Watchdog:
    """Notices workflow code that blocks its task, and engine threads that died (module docstring)."""

    def __init__(
        self,
        worker: TaskRounds,
        threads: list[PollingThread],
        stopping: threading.Event,
        *,
        deadline: float,
        stall: float | None = None,
        telemetry: Telemetry,
        quarantine: Quarantine,
        clock: Callable[[], float] = time.monotonic,
        interrupt: bool = True,
    ) -> None:
        self.deadline = deadline
        self.stall = stall if stall is not None else min(1.0, deadline / 4)
        self.quarantine = quarantine
        self._stepped = clock()  # when the last step ended: a tick much later means it was starved
        self._process_cpu = time.process_time()  # the process's CPU time then
        self._retired: list[PollingThread] = []  # replaced while their code stalled, not yet ended
        self._worker, self._threads, self._stopping = worker, threads, stopping
        self._telemetry, self._clock, self._interrupt = telemetry, clock, interrupt
        self._watches: dict[int, _Watch] = {}  # by thread: the stretch of workflow code it runs now
        self._fired: set[tuple[int, int]] = set()  # claims (task id, lease version) given back
        self._deaths: dict[str, tuple[int, float]] = {}  # by thread name: deaths so far, next restart
        self._lock = threading.Lock()
        self._steps = 0  # steps taken: a thread reads its CPU clock at its first watch after each
        self._baselines = _Baselines()

    def watch(self, task: WorkflowTask, executor: WorkflowExecutor | None) -> _Watch:
        """A context manager around a stretch of ``task``'s workflow code, run in the calling thread."""
        return _Watch(self, task, executor, task.workflow_name, task.run_id)

    def watch_close(self, executor: WorkflowExecutor) -> _Watch:
        """A context manager around the close of a dropped ``executor`` (which runs its code's
        ``finally`` blocks), run in the calling thread: one that blocks is interrupted and its
        thread replaced as a blocked task's is, with no task to give back."""
        return _Watch(self, None, executor, executor.workflow_name, executor.run_id)

    def gave_up(self, task: WorkflowTask) -> bool:
        """Whether this claim of ``task`` was given back while its code blocked."""
        with self._lock:
            return (task.task_id, task.lease.version) in self._fired

    def abandoned(self, task: WorkflowTask) -> bool:
        """Whether this claim of ``task`` was given back while its code blocked (asking forgets it)."""
        key = (task.task_id, task.lease.version)
        with self._lock:
            if key in self._fired:
                self._fired.discard(key)
                return True
            return False

    def round(self, tick: float) -> Callable[[], float]:
        """The watchdog's round for its thread: a step, then ``tick`` seconds of sleep."""

        def watch_round() -> float:
            self.step()
            return tick

        return watch_round

    def step(self) -> int:
        """Replace the threads of stalled workflow code, give up the workflow tasks blocked past
        the deadline (quarantining what it cannot stop), interrupt again the code that swallowed
        its interrupt, replace dead threads."""
        now = self._clock()
        # this thread ticks every fraction of ``stall``: a tick later than the deadline means it
        # could not run — C code held the GIL (or the whole process was stopped)
        starved = now - self._stepped
        if starved > self.deadline:
            log.warning(
                "the watchdog could not run for %.1f s: C code held the GIL, or the process was stopped", starved
            )
        late: list[tuple[_Watch, str, str | None]] = []
        stalled: list[_Watch] = []
        with self._lock:
            for watch in list(self._watches.values()):  # a copy: stretches begin without the lock
                if watch.fired:
                    self._interrupted(watch, now)
                    continue
                if not watch.replaced and now - watch.since > self.stall:
                    stalled.append(watch)
                if now - watch.since <= self.deadline:
                    continue
                watch.fired = True
                watch.spinning = False
                if watch.task is not None:
                    self._fired.add((watch.task.task_id, watch.task.lease.version))
                if watch.executor is not None:
                    watch.executor.abandon()
                held = None
                if starved > self.deadline:  # under the lock, so the thread is alive: its clock can be read
                    held = self._held_gil(_thread_cpu(watch.thread) - watch.cpu, now - watch.since)
                late.append((watch, blocked_at(watch.thread), held))  # before the interrupt unwinds it
                if self._interrupt:
                    watch.interrupted_at = now
                    _interrupt(watch.thread)
        fired = [watch for watch, _where, _held in late]
        replaced = sum(self._replace(watch, at_most=8) for watch in stalled if watch not in fired)
        for watch, where, held in late:
            self._blocked(watch, where, held)
        revived = self._revive()
        with self._lock:
            for watch in list(self._watches.values()):
                if not watch.fired:
                    watch.cpu = _thread_cpu(watch.thread)  # from here on (NaN where unknown: no verdict)
            self._stepped, self._process_cpu = self._clock(), time.process_time()
            self._steps += 1
        return replaced + len(late) + revived

    def _interrupted(self, watch: _Watch, now: float) -> None:
        """``watch`` was interrupted and its thread is still in its code: it swallowed the
        interrupt, or waits in a call that returns later. Interrupt it again every ``stall``
        seconds, and report the thread (once) to the quarantine. Called under the lock, so the
        thread is still in that code (its stretch cannot end meanwhile)."""
        if not self._interrupt or now - watch.interrupted_at < self.stall:
            return
        watch.interrupted_at = now
        _interrupt(watch.thread)
        if not watch.spinning:
            watch.spinning = True
            self.quarantine.interrupted(watch.thread, watch.workflow, watch.run_id)

    def _held_gil(self, cpu: float, held: float) -> str | None:
        """Why code that ran ``held`` seconds while the watchdog could not run, its thread using
        ``cpu`` seconds of CPU since the watchdog's last step, is beyond its reach: it held the
        GIL, its thread having had most of the process's CPU meanwhile (and a good part of a
        deadline of it). None when it waited for the GIL, held by another thread, or when the
        whole process was stopped or starved of CPU by the host."""
        process = time.process_time() - self._process_cpu
        if not (cpu >= self.deadline / 2 and cpu >= 0.8 * process):  # NaN too: unknown
            return None
        return (
            f"it held the GIL for {held:.1f} s (C code, such as a regular expression that backtracks): "
            "no other thread of the process ran meanwhile, and no interrupt can stop it"
        )

    def _overran(self, watch: _Watch, held: float, cpu: float) -> None:
        """A stretch of workflow code ended past the deadline before the watchdog fired on it
        (its result is written as usual): between two ticks, or while C code of it held the
        GIL, so that the watchdog could not run. Counted as a block of its workflow."""
        starved = self._clock() - self._stepped > self.deadline
        beyond = self._held_gil(cpu, held) if starved else None
        log.warning(
            "the workflow code of run %s (%s) held its thread for %.1f s, past the deadline of %g s%s",
            watch.run_id,
            watch.workflow,
            held,
            self.deadline,
            f"; {beyond}" if beyond else "",
            extra={"run_id": watch.run_id, "workflow_name": watch.workflow},
        )
        self.quarantine.blocked(watch.workflow, watch.run_id, beyond)

    def _replace(self, watch: _Watch, at_most: int | None = None) -> bool:
        """Retire the thread running ``watch`` (it leaves once its code returns) and start a fresh
        one that takes over the rest of its round; False when it was done already, or when
        ``at_most`` retired threads are still alive."""
        self._retired = [thread for thread in self._retired if thread.alive]
        if watch.replaced or self._stopping.is_set() or (at_most is not None and len(self._retired) >= at_most):
            return False
        watch.replaced = True
        for index, thread in enumerate(self._threads):
            if thread.ident == watch.thread:
                thread.retire()  # it leaves when the blocked call returns
                self._retired.append(thread)
                fresh = thread.fresh()
                self._threads[index] = fresh
                fresh.start()
        self._worker.hand_over(watch.thread)
        return True

    def _blocked(self, watch: _Watch, where: str, held_gil: str | None) -> None:
        self._replace(watch)
        blocked = f"for more than {self.deadline:g} s, at {where}" + (f"; {held_gil}" if held_gil else "")
        if watch.task is not None:
            self._worker.retry_later(watch.task, f"its workflow code blocked the task {blocked}")
        else:  # a close: the run lost nothing (its next task replays it), the thread is replaced
            log.warning(
                "closing the executor of run %s (%s), its workflow code blocked %s",
                watch.run_id,
                watch.workflow,
                blocked,
                extra={"run_id": watch.run_id, "workflow_name": watch.workflow},
            )
        self.quarantine.blocked(watch.workflow, watch.run_id, held_gil)

    def _revive(self) -> int:
        if self._stopping.is_set():
            return 0
        revived = 0
        for index, thread in enumerate(self._threads):
            if thread.alive or thread.retired:
                continue
            deaths, not_before = self._deaths.get(thread.name, (0, 0.0))
            now = self._clock()
            if now < not_before:
                continue
            # the fresh thread runs and stands in the list before the death is reported, so whoever
            # hears of it (a log handler, a metric, a health check) finds the engine whole again
            fresh = thread.fresh()
            fresh.start()
            self._threads[index] = fresh
            self._deaths[thread.name] = (deaths + 1, now + min(60.0, 0.1 * 2**deaths))
            log.critical("engine thread %s died (%d time(s) before); started a new one", thread.name, deaths)
            self._telemetry.thread_died(thread.name)
            revived += 1
        return revived


def blocked_at(thread: int) -> str:
    """Where ``thread`` is: the innermost frame outside dex as ``file:line in function``, then
    the stack of code outside dex (outermost first)."""
    frame = sys._current_frames().get(thread)
    frames: list[FrameType] = []
    while frame is not None:
        outside = not os.path.abspath(frame.f_code.co_filename).startswith(_DEX + os.sep)
        if outside and frame.f_globals.get("__name__") != "threading":  # not the thread's own bootstrap
            frames.append(frame)
        frame = frame.f_back
    if not frames:
        return "an unknown place (the thread is in dex's own code)"
    here = frames[0]
    stack = "".join(f"\n  {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in reversed(frames[:12]))
    return f"{here.f_code.co_filename}:{here.f_lineno} in {here.f_code.co_name}; stack (outside dex):{stack}"


def _thread_cpu(thread: int) -> float:
    """The CPU time ``thread`` has used (NaN where the platform does not tell). Only for a thread
    known to be alive: the watchdog asks under its lock, for a thread inside a watched stretch."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread))
    except (AttributeError, OSError):  # not a POSIX platform with per-thread clocks
        return float("nan")


def _interrupt(thread: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(WorkflowTaskBlocked))


def _clear_interrupt(thread: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)
