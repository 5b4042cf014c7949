"""The deterministic simulator: a small dex cluster in one thread, driven by a seed.

A :class:`Simulator` owns one in-memory store on a virtual clock and several nodes, each a
``dex.Engine`` over that store that is never started: the simulator calls the components'
steps itself (leader election, the two schedulers, maintenance, claiming, executing,
flushing the result buffer), choosing with ``random.Random(seed)`` which node does what
next, when the clock moves and when a client starts a run, sends an event, cancels, suspends
or resumes. Before any step a fault from the schedule may strike (see :mod:`.faults`).

After every step the referee's ledgers have checked each lease and result as it happened and
the run statuses are compared with the last ones; at the end the surviving nodes finish
what they hold, a fault-free drain runs everything left, and every run must have ended
exactly once with a history that replays. Retention then must delete every run.

Everything is a function of the seed and the fault schedule, so a failure names both, and
``Simulator(seed, faults).run()`` replays it step for step.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

import dex
from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE
from dex.app.ports.store import RunFilter
from dex.app.runtime.options import RuntimeOptions
from dex.domain.status import RunStatus
from dex.serialization.payloads import PayloadConverter
from dex.simulation.clients import Action, Clients
from dex.simulation.faults import Fault, schedule
from dex.simulation.invariants import InvariantViolation
from dex.simulation.nodes import WORKFLOW_LEASE, Node, claim_and_drop, new_node
from dex.simulation.observed import ObservedAdapter, StoreUnavailable
from dex.simulation.referee import Referee
from dex.simulation.workload import STANDARD_WORKLOAD, Workload, World, inhabiting

LEADER_LEASE = timedelta(seconds=15)
RETENTION = timedelta(minutes=5)
SETTLE_ROUNDS = 5000
CONVERTER = PayloadConverter()  # stateless once built, and costly to build
STALL_STEPS = 60
WATCHDOG_TICK = timedelta(seconds=2)  # well within the watchdogs' deadline (5 s): a gap past it is starvation


@attrs.frozen
class Report:
    """What a simulation did: its trace, how the runs ended, what the store saw."""

    seed: int
    faults: tuple[Fault, ...]
    trace: tuple[str, ...]
    outcomes: dict[str, int]
    counts: dict[str, int]


class SimulationFailure(AssertionError):
    """A simulation broke an invariant (or the engine raised); the message says how to replay it."""

    def __init__(self, reproduction: str, cause: BaseException, trace: list[str]) -> None:
        tail = "\n".join(trace[-40:])
        super().__init__(f"{type(cause).__name__}: {cause}\n\nreplay with:\n    {reproduction}\n\nlast steps:\n{tail}")
        self.reproduction = reproduction
        self.cause = cause


class Simulator:
    """A seeded, single-threaded run of a dex cluster under a fault schedule."""

    def __init__(
        self,
        seed: int,
        faults: Iterable[Fault | tuple[int, str, int]] = (),
        *,
        steps: int = 300,
        nodes: int = 3,
        max_runs: int = 5,
        workload: Workload = STANDARD_WORKLOAD,
        adapter_class: type[ObservedAdapter] = ObservedAdapter,
        engine_options: Mapping[str, Any] | None = None,
        inline: bool = False,
        chained: bool = False,
    ) -> None:
        self.seed, self.faults, self.steps = seed, schedule(faults), steps
        self.node_count, self.max_runs, self.workload = nodes, max_runs, workload
        self.engine_options = dict(engine_options or {})
        # With inline, every node runs first attempts inline (dex.app.workflows.inline) as a started
        # engine does, every activity counting as quick: no timing decides anything here.
        self.inline = inline
        # With chained, nothing runs in the workflow threads and every answered step chains the
        # run's next activities in its attempt's thread (Engine(chained_activity_seconds=...)).
        self.chained = chained
        self.rng = random.Random(seed)
        self.world = World(random.Random(f"world:{seed}"))
        self.clock = dex.testing.VirtualClock()
        self.referee = Referee(RETENTION, workload.cleanups)
        self.store = adapter_class(
            self.clock, self.referee, random.Random(f"ids:{seed}"), transaction_connection=self.world.connection
        )
        self.converter = CONVERTER
        self.trace: list[str] = []
        self.step_no = 0
        self._checks = 0
        self._started = self.clock.now()
        self._node_serial = 0
        self.nodes = [self._new_node() for _ in range(nodes)]
        # clients start runs and send requests through an engine that does no work: sending an
        # event writes (and waits for) that event only, as it does from any application thread
        self.client = self._engine("client")
        self.clients = Clients(self.client, self.referee, workload, self.rng, max_runs)
        self.longest_lease = max(
            [WORKFLOW_LEASE, *(getattr(fn, ACTIVITY_ATTRIBUTE).lock_timeout for fn in workload.activities)]
        )

    def reproduction(self) -> str:
        return (
            f"Simulator(seed={self.seed}, faults={list(self.faults)!r}, steps={self.steps}, "
            f"nodes={self.node_count}, max_runs={self.max_runs}"
            + ("" if self.workload is STANDARD_WORKLOAD else f", workload={self.workload!r}")
            + (f", engine_options={self.engine_options!r}" if self.engine_options else "")
            + (", inline=True" if self.inline else "")
            + (", chained=True" if self.chained else "")
            + ("" if type(self.store) is ObservedAdapter else f", adapter_class={type(self.store).__name__}")
            + ").run()"
        )

    # -- the whole run -------------------------------------------------------------------------
    def run(self) -> Report:
        """Simulate, settle and check; raise SimulationFailure when an invariant breaks."""
        faults_at: dict[int, list[Fault]] = {}
        for fault in self.faults:
            faults_at.setdefault(fault.at_step, []).append(fault)
        with inhabiting(self.world):
            try:
                for step in range(self.steps):
                    self.step_no = step
                    for fault in faults_at.get(step, []):
                        try:
                            detail = self._inject(fault)
                        except ConnectionError as exc:  # a store-errors fault cut this one short
                            detail = f"cut short, the store is unavailable ({exc})"
                        self._log("fault", fault.kind, detail)
                        self._check_step()
                    self._act()
                    self._check_step()
                self.step_no = self.steps
                self._check_step(everything=True)
                self._settle()
                self.referee.final_checks(self.store, self.workload, self.world.executions, self.converter)
                self._sweep()
            except Exception as exc:  # an invariant, or anything the engine raised: both are findings
                raise SimulationFailure(self.reproduction(), exc, self.trace) from exc
            finally:  # the nodes' executors closed, as a stopping engine closes its own
                for node in self.nodes:
                    node.engine.workflow_worker.forget()
        outcomes = Counter(
            f"{log.workflow_name}:{self.referee.statuses.last[run_id].status.value}"
            for run_id, log in self.referee.runs.items()
        )
        return Report(self.seed, self.faults, tuple(self.trace), dict(outcomes), dict(self.referee.counts))

    def _log(self, who: str, what: str, detail: str | None = None) -> None:
        elapsed = (self.clock.now() - self._started).total_seconds()
        self.trace.append(f"{self.step_no:4d} {elapsed:8.1f}s {who:<6} {what}" + (f": {detail}" if detail else ""))

    def _check_step(self, everything: bool = False) -> None:
        if self.referee.violations:  # raised inside a store call, perhaps caught by the engine
            raise self.referee.violations[0]
        # live runs after every step; ended runs (which must never change) every tenth
        self._checks += 1
        self.referee.statuses.observe(
            self.referee.records(self.store, everything or self._checks % 10 == 0), self.clock.now()
        )

    # -- nodes -----------------------------------------------------------------------------------
    def _engine(
        self,
        name: str,
        store: Any = None,
        rng: random.Random | None = None,
        runtime_options: RuntimeOptions | None = None,
        **options: Any,
    ) -> dex.Engine:
        return dex.Engine(
            store if store is not None else self.store,
            workflows=self.workload.workflows,
            activities=self.workload.activities,
            node_id=name,
            workflow_task_lease=WORKFLOW_LEASE,
            leader_lease=LEADER_LEASE,
            retention=RETENTION,
            rng=rng if rng is not None else random.Random(self.rng.getrandbits(64)),
            converter=self.converter,
            runtime_options=runtime_options,
            **{**options, **self.engine_options},  # the engine_options given to the simulator win
        )

    def _new_node(self) -> Node:
        self._node_serial += 1
        activities = [getattr(fn, ACTIVITY_ATTRIBUTE).name for fn in self.workload.activities]
        return new_node(
            f"n{self._node_serial}",
            self.store,
            self.rng,
            self._engine,
            activities,
            self.inline,
            self._monotonic,
            self.chained,
        )

    def _pass_time(self, to: datetime) -> None:
        """The virtual clock moves on to ``to`` (if later); each node's watchdog ticks on the way,
        at most ``WATCHDOG_TICK`` apart (a long jump in at most a thousand ticks), as its thread
        does while the node waits. (Left unstepped through a jump, a watchdog takes the gap for
        a process that could not run.)"""
        tick = max(WATCHDOG_TICK, (to - self.clock.now()) / 1000)
        while self.clock.now() + tick < to:
            self.clock.advance(tick)
            self._tick_watchdogs()
        self.clock.advance_to(to)
        self._tick_watchdogs()

    def _tick_watchdogs(self) -> None:
        for node in self.nodes:
            acted = node.watchdog_step()
            if acted:  # nothing blocks on a virtual clock: a finding, kept in the trace
                self._log(node.name, "watchdog", acted)

    def _monotonic(self) -> float:
        """The nodes' monotonic clock: seconds of virtual time since the simulation began."""
        return (self.clock.now() - self._started).total_seconds()

    def _replace(self, index: int) -> str:
        old = self.nodes[index]
        # a process that dies finalizes nothing; a node dropped here would leave its executors to
        # the garbage collector, which closes a started workflow coroutine (replay-silent) but
        # warns that one never started was never awaited (a run suspended in the block that
        # started it): closed now, the same for the one and without the warning for the other
        old.engine.workflow_worker.forget()
        self.nodes[index] = self._new_node()
        return f"{old.name} gone ({old.held()} held or buffered), {self.nodes[index].name} joins"

    # -- choosing a step ----------------------------------------------------------------------------
    def _act(self) -> None:
        options = self.clients.actions() + self._clock_actions()
        for node in self.nodes:
            options += node.actions(self.rng, stalled=self.step_no < node.stalled_until)
        _weight, who_what, action = self.rng.choices(options, weights=[o[0] for o in options])[0]
        who, _, what = who_what.partition(" ")
        try:
            detail = action()
        except ConnectionError as exc:
            if not any(node.name == who for node in self.nodes):
                raise
            # the store failed the node's step: its polling thread would back off and go on
            detail = f"failed, the store is unavailable ({exc})"
        self._log(who, what, detail)

    def _clock_actions(self) -> list[Action]:
        def tick() -> str:
            self._pass_time(self.clock.now() + timedelta(seconds=self.rng.choice([0.5, 1, 2, 3, 5])))
            return ""

        def jump() -> str:
            due = self.store.next_due_time(self.clock.now())
            if due is None:
                return "nothing due"
            self._pass_time(due)
            return "to the next due moment"

        return [(3.0, "clock tick", tick), (1.0, "clock jump", jump)]

    # -- faults -----------------------------------------------------------------------------------
    def _target(self, fault: Fault, wants: Callable[[Node], bool]) -> int:
        """The index of the node a fault strikes: ``pick`` among those that ``wants``, if any."""
        wanted = [i for i, node in enumerate(self.nodes) if wants(node)]
        return wanted[fault.pick % len(wanted)] if wanted else fault.pick % len(self.nodes)

    def _inject(self, fault: Fault) -> str | None:
        def holds(n: Node) -> bool:
            return n.holds_tasks() or bool(len(n.engine.buffer))

        wants: dict[str, Callable[[Node], bool]] = {
            "crash": holds,
            "crash-after-execute": Node.holds_tasks,
            "crash-mid-flush": lambda n: len(n.engine.buffer) > 1,
            "write-fails": lambda n: len(n.engine.buffer) > 0,
            "write-ack-lost": lambda n: len(n.engine.buffer) > 0,
            "restart": holds,
        }
        index = self._target(fault, wants.get(fault.kind, lambda _n: True))
        node = self.nodes[index]
        now = self.clock.now()
        match fault.kind:
            case "crash":
                return self._replace(index)
            case "crash-after-claim":
                claimed = claim_and_drop(node, now)
                return f"claimed {claimed.strip() or 'nothing'}; " + self._replace(index)
            case "crash-after-execute":
                node.finish_held(self._log)
                return self._replace(index)
            case "crash-mid-flush":
                buffer = node.engine.buffer
                # (heartbeats in the buffer die with it; only results and outcomes are written)
                outcomes, results = buffer.pending_outcomes(), buffer.pending_results()
                half = (len(outcomes) + len(results)) // 2
                written_outcomes, written_results = outcomes[:half], results[: max(0, half - len(outcomes))]
                if written_outcomes:
                    self.store.complete_activity_tasks(written_outcomes, now)
                if written_results:
                    self.store.complete_workflow_tasks(written_results, now)
                return f"wrote {half} of {len(outcomes) + len(results)}; " + self._replace(index)
            case "restart":
                node.finish_held(self._log)
                failed = node.store.failed
                node.engine.stop(timeout=0)
                # a graceful stop flushes everything, unless the store fails it (then what is
                # unwritten is redone when its leases lapse, as after a crash)
                if len(node.engine.buffer) and node.store.failed == failed:
                    raise InvariantViolation("graceful-stop", f"{node.name} stopped with results still buffered")
                return self._replace(index)
            case "write-fails" | "write-ack-lost":
                buffered = len(node.engine.buffer)
                self.store.sabotage = "refuse" if fault.kind == "write-fails" else "lose-ack"
                try:
                    node.engine.buffer.flush()
                except StoreUnavailable:
                    pass
                finally:
                    self.store.sabotage = None
                return f"{node.name} flushed {buffered}; {len(node.engine.buffer)} kept to send again"
            case "duplicate":
                return self.store.deliver_again(fault.pick, now) or "nothing delivered yet"
            case "hang":
                holders = [n for n in self.nodes[index:] + self.nodes[:index] if len(n.pool)]
                if not holders:
                    return "no activity in flight"
                task = holders[0].pool.hang(0)
                assert task is not None
                return f"{holders[0].name} task {task.task_id} {task.name} hangs"
            case "flush-stall":
                node.stalled_until = self.step_no + STALL_STEPS
                return f"{node.name} writes nothing until step {node.stalled_until}"
            case "lease-expiry":
                self._pass_time(now + self.longest_lease + timedelta(seconds=1))
                return None
            case "leader-loss":
                leaders = [n.name for n in self.nodes if n.engine.leader.is_leader]
                self._pass_time(now + LEADER_LEASE + timedelta(seconds=1))
                others = [n for n in self.nodes if n.name not in leaders] or self.nodes
                taker = others[fault.pick % len(others)]
                took = taker.engine.leader.step()
                return f"{', '.join(leaders) or 'nobody'} led; {taker.name} {'takes over' if took else 'cannot lead'}"
            case "activity-fails":
                self.world.forced.extend(["retryable", "retryable"])
                return None
            case "activity-fails-terminally":
                self.world.forced.append("terminal")
                return None
            case "store-errors":
                node.store.failing += 1 + fault.pick
                return f"{node.name}'s next {node.store.failing} store calls fail"
            case "store-flaky":
                node.store.flaky += 30
                return f"about a third of {node.name}'s next {node.store.flaky} store calls fail"
        raise AssertionError(fault.kind)  # pragma: no cover - Fault validates its kind

    # -- the end ------------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Survivors finish what they hold; suspended runs resume; a fault-free drain runs the rest."""
        self.world.forced.clear()
        for node in self.nodes:
            node.stalled_until = -1
            node.store.heal()
            node.finish_held(self._log)
            node.engine.buffer.flush()
        for run_id, record in self.referee.records(self.store).items():
            if record is not None and record.status is RunStatus.SUSPENDED:
                self.client.resume(run_id)
        engine = self.nodes[0].engine
        engine.runtime.disarm()  # the drain flushes inline
        self._log("settle", "drain", f"{sum(len(n.pool.hung) for n in self.nodes)} activities left hanging")
        for _ in range(SETTLE_ROUNDS):
            worked = engine.workflow_scheduler.step() + engine.activity_scheduler.step()
            worked += engine.workflow_worker.poll_once() + engine.buffer.flush()
            worked += engine.activity_worker.poll_once() + engine.buffer.flush()
            self._check_step()
            if worked:
                continue
            due = self.store.next_due_time(self.clock.now())
            if due is None:
                return
            self._pass_time(due)
        raise InvariantViolation("every-run-ends", f"the cluster did not settle in {SETTLE_ROUNDS} rounds")

    def _sweep(self) -> None:
        """Past the retention period, maintenance deletes every finished run."""
        self._pass_time(self.clock.now() + RETENTION + timedelta(minutes=2))
        node = self.nodes[0]
        while not node.engine.leader.step():
            self._pass_time(self.clock.now() + LEADER_LEASE)
        while node.engine.maintenance.step():
            pass
        self._check_step(everything=True)
        left = self.store.list_runs(RunFilter(limit=10**6))
        if left:
            raise InvariantViolation("retention", f"{len(left)} finished runs outlived the retention period")
        self._log("settle", "swept", f"{len(self.referee.runs)} runs deleted")
