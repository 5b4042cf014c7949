"""The simulated nodes: one engine each, running the started engine's own rounds.

A :class:`Node` is a ``dex.Engine`` armed as ``Engine.start()`` arms it — its coordinator
(:mod:`dex.app.runtime.coordinator`), eager dispatch, the write buffer in background mode, inline
activities when asked, a watchdog — but with no thread: the simulator (``simulator.py``) calls
the same rounds the engine's threads call (:mod:`dex.app.runtime.rounds`: scheduler, workflows,
activities, the two flushes) when it picks the node for a step, and steps its watchdog as
virtual time passes. What the simulation varies is passed to the engine's constructor
(:class:`dex.app.runtime.options.RuntimeOptions`): the virtual clock, the attempt pool — a
:class:`~dex.simulation.pool.SimulatedPool`, where the attempts the coordinator hands over wait
until the simulator runs one —, a watchdog that interrupts no thread, seeded randomness and
batch sizes, and a :class:`Tally` that hears the coordinator's decisions. What the node holds
between steps — tasks handed to its workflow worker, attempts waiting in its pool, its buffer —
is what a crash loses. Each node reaches the shared store through its own
:class:`dex.simulation.faults.NodeStore`, where store-error faults strike.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

import dex
from dex.app.activities.attempts import Durations
from dex.app.machinery.buffer import ACTIVITY_LANE, WORKFLOW_LANE
from dex.app.ports.store import ActivityTask, WorkflowTask
from dex.app.runtime import coordinator as co
from dex.app.runtime.options import RuntimeOptions
from dex.app.runtime.rounds import Rounds
from dex.simulation.clients import Action
from dex.simulation.faults import NodeStore
from dex.simulation.observed import ObservedAdapter
from dex.simulation.pool import SimulatedPool

WORKFLOW_LEASE = timedelta(seconds=30)
ACTIVITY_SLOTS = 4  # each node's pool: small, so that claims find it full now and then

Log = Callable[[str, str, str | None], None]  # (who, what, detail) into the simulation's trace


class EngineMaker(Protocol):
    """How the simulator makes a node's engine: over ``store``, with ``rng`` and the runtime's
    ``runtime_options``, and the engine options the node asks for."""

    def __call__(
        self, name: str, store: NodeStore, rng: random.Random, runtime_options: RuntimeOptions, **options: Any
    ) -> dex.Engine: ...


@attrs.define
class Tally:
    """What a node's runtime tells the simulation: the coordinator's decisions (for the trace)
    and the tasks eager dispatch gave the node (counted: the simulation covers it)."""

    said: list[str] = attrs.Factory(list)  # what its coordinator decided during the current step
    # tasks that eager dispatch ("complete, then claim") gave it, by kind
    dispatched: dict[str, int] = attrs.Factory(lambda: {"activity": 0, "workflow": 0})

    def observe(self, event: co.Event, commands: tuple[co.Command, ...]) -> None:
        """The coordinator's every decision: into the trace, and counted."""
        self.said.append(_describe(event, commands))
        if isinstance(event, co.ActivitiesClaimed) and event.started is None:
            self.dispatched["activity"] += len(event.tasks)

    def handed(self, tasks: Sequence[WorkflowTask]) -> None:
        """Workflow tasks a completion (or a start) claimed for the node's workflow worker."""
        self.dispatched["workflow"] += len(tasks)

    def decided(self) -> str:
        """What the coordinator decided since the last call (for the trace)."""
        said, self.said[:] = "; ".join(self.said), []
        return said


@attrs.define
class Node:
    """One simulated engine process (module docstring)."""

    name: str
    engine: dex.Engine
    store: NodeStore  # the node's way to the shared store (store-errors faults strike here)
    pool: SimulatedPool
    tally: Tally
    stalled_until: int = -1  # the step until which its writes stall

    @property
    def rounds(self) -> Rounds:
        return self.engine.runtime.rounds

    @property
    def dispatched(self) -> dict[str, int]:
        """Tasks that eager dispatch gave the node, by kind."""
        return self.tally.dispatched

    def held(self) -> int:
        """How many results and tasks the node holds: what a crash loses."""
        return len(self.engine.buffer) + self.engine.workflow_worker.backlog() + len(self.pool) + len(self.pool.hung)

    def holds_tasks(self) -> bool:
        return bool(self.engine.workflow_worker.backlog() or len(self.pool))

    def pending(self, lane: str) -> bool:
        """Whether ``lane`` of its buffer holds something to write."""
        return bool(self.engine.buffer.pending(lane))

    def run_attempt(self, index: int) -> str:
        task = self.pool.run(index)
        return _verdict(self, task)

    def actions(self, rng: random.Random, *, stalled: bool) -> list[Action]:
        """The node's possible next steps: one of the rounds its threads would run, or an
        attempt of its pool; no flush while its writes are ``stalled``."""
        rounds, name = self.rounds, self.name

        def said(what: str) -> str:
            decided = self.tally.decided()
            return f"{what}; {decided}" if decided else what

        def scheduler() -> str:
            idle = rounds.scheduler()
            return said(f"{'leads' if self.engine.leader.is_leader else 'follows'}, idle {idle:.3g}s")

        def flush(lane: str) -> Callable[[], str]:
            def flush_round() -> str:
                before = len(self.engine.buffer)
                rounds.flush(lane)
                return said(f"{before - len(self.engine.buffer)} written")

            return flush_round

        actions: list[Action] = [
            (2.0, f"{name} scheduler", scheduler),
            (2.0, f"{name} workflows", lambda: said(f"idle {rounds.workflows():.3g}s")),
            (2.0, f"{name} activities", lambda: said(f"idle {rounds.activities():.3g}s")),
        ]
        if len(self.pool):
            actions.append((3.0, f"{name} run-attempt", lambda: said(self.run_attempt(rng.randrange(len(self.pool))))))
        if not stalled:
            actions += [(3.0, f"{name} {what}", flush(lane)) for what, lane in LANES if self.pending(lane)]
        return actions

    def watchdog_step(self) -> str:
        """Step the watchdog of the node's start (the simulator does, as virtual time passes);
        what it did, for the trace ("" if nothing: no workflow code runs long on a virtual clock)."""
        watchdog = self.engine.runtime.watchdog
        acted = watchdog.step() if watchdog is not None else 0
        return f"gave back or replaced {acted}" if acted else ""

    def finish_held(self, log: Log) -> None:
        """Run every task the node holds: the handed workflow tasks, the attempts in its pool."""
        worker = self.engine.workflow_worker
        while worker.backlog():
            ran = worker.poll_once(claim=False)
            log(self.name, "workflows", f"{ran} handed tasks")
            if not ran:
                break
        while len(self.pool):
            log(self.name, "run-attempt", self.run_attempt(0))


def _verdict(node: Node, task: ActivityTask | None) -> str:
    if task is None:
        return "nothing"
    for outcome in reversed(node.engine.buffer.pending_outcomes()):
        if outcome.task.task_id == task.task_id and outcome.task.lease.version == task.lease.version:
            verdict = "ok" if outcome.result is not None else "retry" if outcome.retry_at is not None else "failed"
            return f"task {task.task_id} {task.name} #{task.attempt} -> {verdict}"
    return f"task {task.task_id} {task.name} #{task.attempt} -> nothing buffered"


def _describe(event: co.Event, commands: tuple[co.Command, ...]) -> str:
    """One event and its commands, briefly, for the trace."""
    name = type(event).__name__
    fields = {key: value for key, value in attrs.asdict(event, recurse=False).items() if key not in ("now", "started")}
    if "tasks" in fields:
        fields["tasks"] = [task.task_id for task in fields["tasks"]]
    said = ", ".join(f"{key}={_plain(value)}" for key, value in fields.items())
    out = ", ".join(_command(command) for command in commands)
    return f"{name}({said})" + (f" -> {out}" if out else "")


def _command(command: co.Command) -> str:
    if isinstance(command, co.RunAttempt):
        return f"RunAttempt({command.task.task_id})"
    if isinstance(command, co.Pause):
        return f"Pause({command.seconds:.3g})"
    if isinstance(command, co.Wake):
        return f"Wake({_plain(command.topics)})"
    if isinstance(command, co.Claim):
        return f"Claim({command.kind}, {command.limit})"
    return type(command).__name__


def _plain(value: object) -> str:
    """A value for the trace, the same in every process (a set's order follows string hashes)."""
    if isinstance(value, (set, frozenset)):
        return "{" + ",".join(sorted(map(str, value))) + "}"
    return str(value)


def new_node(
    name: str,
    shared: ObservedAdapter,
    rng: random.Random,
    engine_over: EngineMaker,
    activities: Collection[str],
    inline: bool,
    monotonic: Callable[[], float],
    chained: bool = False,
) -> Node:
    """A node named ``name`` over the ``shared`` store, its engine made by ``engine_over`` over
    simulated parts (``activities``: the names of the activities it runs), armed as a started
    engine is, its rounds timed by the virtual ``monotonic`` clock."""
    store = NodeStore(shared, random.Random(rng.getrandbits(64)))
    engine_rng = random.Random(rng.getrandbits(64))
    # the backoff of a task given back (retry_later) draws its jitter from the seed too
    jitter = random.Random(rng.getrandbits(64))
    workflow_round, activity_claim = rng.randint(1, 3), rng.randint(1, 3)  # small rounds: finer interleavings
    pool = SimulatedPool()
    tally = Tally()
    durations: Durations = Durations()
    timing: dict[str, float] = {"inline_activity_seconds": 0.0}  # nothing inline
    if chained:
        # every activity too slow for the workflow thread and quick enough to chain: each runs
        # as a task, and every step answered after it chains the run's next ones (no timing
        # decides anything: the durations read are fixed)
        durations = _Chainable()
        timing = {"inline_activity_seconds": 0.1, "chained_activity_seconds": 1.0}
    elif inline:
        # every activity counts as quick from the start (the attempts' wall times recorded
        # later stay far below the limit)
        for activity in activities:
            durations.record(activity, 0.0)
        timing = {"inline_activity_seconds": 1.0, "chained_activity_seconds": 0.0}
    options = RuntimeOptions(
        monotonic=monotonic,
        attempt_pool=lambda _threads: pool,
        group_threads=0,  # parked groups go on in the workflow round: no thread decides their order
        await_on_loop=False,  # async attempts run in the pool's call, when the simulator says
        interrupt=False,  # no thread to interrupt: the simulator runs all in its own
        slots_ttl=0.0,  # the queues' slots read afresh each time, not after some wall time
        jitter=jitter,
        workflow_round=workflow_round,
        activity_claim=activity_claim,
        durations=durations,
        observe=tally.observe,
        handed=tally.handed,
    )
    engine = engine_over(name, store, engine_rng, options, activity_concurrency=ACTIVITY_SLOTS, **timing)
    engine.runtime.arm()
    return Node(name=name, engine=engine, store=store, pool=pool, tally=tally)


class _Chainable(Durations):
    """Every activity's attempts typically took 0.5 s: too slow for a workflow thread that runs
    up to 0.1 s inline, quick enough to chain up to 1 s (``new_node(chained=True)``)."""

    def typical(self, name: str) -> float | None:
        return 0.5


LANES = (("flush-activities", ACTIVITY_LANE), ("flush-workflows", WORKFLOW_LANE))


def claim_and_drop(node: Node, now: datetime) -> str:
    """Claim what a node would (a crash then loses it): workflow tasks, and activity tasks into
    its pool through its own activity round."""
    tasks: list[WorkflowTask] = node.store.claim_workflow_tasks(
        frozenset(node.engine.registry.workflows), node.name, now, WORKFLOW_LEASE, 3
    )
    node.rounds.activities()
    attempts = [job.task.task_id for job in node.pool.jobs if job.task is not None]
    return " ".join(str(t.task_id) for t in tasks) + " " + " ".join(str(a) for a in attempts)
