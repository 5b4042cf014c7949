"""The simulated workload: a handful of workflows and activities, and the world they run in.

The workflows exercise what a run can do: activities with retries and compensation, durable
timers, external events with timeouts, child runs, ``gather`` over steps and over coroutines,
side effects, ``ctx.random()`` and ``continue_as_new``. Their results are checked against
what the code must produce whatever the interleaving.

Activities ask the :class:`World` of the simulation that runs them (a context variable the
simulator sets while it runs) whether this execution fails; the world draws on the seed and
on the faults injected, and counts every execution so that the checks can tell that each
recorded result came from a real one.
"""

from __future__ import annotations

import json
import random
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

import dex
from dex.app.definitions.registry import WORKFLOW_ATTRIBUTE
from dex.app.ports.store import RunRecord
from dex.domain.status import RunStatus

# -- the world -------------------------------------------------------------------------------


class World:
    """What activities see of the simulation: injected failures and the record of executions."""

    def __init__(self, rng: random.Random, *, failure_rate: float = 0.1) -> None:
        self.rng = rng
        self.failure_rate = failure_rate
        self.forced: deque[str] = deque()  # "retryable" or "terminal", for the next executions
        self.executions: Counter[tuple[str, str, str]] = Counter()  # (run id, activity, args)
        self.committed: Counter[str] = Counter()  # what transaction steps' connections committed

    def connection(self) -> LedgerConnection:
        """A database connection for a transaction step (``InMemoryAdapter(transaction_connection=)``)."""
        return LedgerConnection(self.committed)

    def perform(self, name: str, args: tuple[Any, ...]) -> None:
        """Record one execution of activity ``name``; raise if this one is to fail."""
        context = dex.activity_context()
        self.executions[(context.run_id, name, args_key(args))] += 1
        if self.forced:
            if self.forced.popleft() == "terminal":
                raise dex.TerminalError(f"{name} refused for good")
            raise RuntimeError(f"{name} failed on purpose")
        if self.rng.random() < self.failure_rate:
            raise RuntimeError(f"{name} failed by chance")


class LedgerConnection:
    """A transaction step's stand-in connection: ``write(key)`` until ``commit()`` or ``rollback()``."""

    def __init__(self, committed: Counter[str]) -> None:
        self._committed, self._pending = committed, list[str]()

    def write(self, key: str) -> None:
        self._pending.append(key)

    def commit(self) -> None:
        self._committed.update(self._pending)
        self._pending.clear()

    def rollback(self) -> None:
        self._pending.clear()


_WORLD: ContextVar[World | None] = ContextVar("dex_simulation_world", default=None)


@contextmanager
def inhabiting(world: World) -> Iterator[World]:
    """Make ``world`` the one that activities (and side effects) in this thread see."""
    token = _WORLD.set(world)
    try:
        yield world
    finally:
        _WORLD.reset(token)


def current_world() -> World:
    world = _WORLD.get()
    if world is None:
        raise RuntimeError("simulated activities run only inside a Simulator")
    return world


def args_key(args: Any) -> str:
    """A canonical text of JSON-compatible arguments (tuples and lists alike)."""
    return json.dumps(list(args), sort_keys=True)


# -- activities: each result is a pure function of the arguments --------------------------------

FAST_RETRY = dex.RetryPolicy(
    initial_delay=timedelta(seconds=1),
    multiplier=2.0,
    randomization_factor=0.5,
    max_delay=timedelta(seconds=20),
    max_attempts=4,
)
PATIENT_RETRY = dex.RetryPolicy(
    initial_delay=timedelta(seconds=1), multiplier=1.5, max_delay=timedelta(seconds=10), max_attempts=8
)

RESULTS: dict[str, Callable[..., Any]] = {
    "sim-charge": lambda order_id, amount: f"receipt:{order_id}:{amount}",
    "sim-ship": lambda order_id: f"parcel:{order_id}",
    "sim-refund": lambda order_id, amount: f"refund:{order_id}:{amount}",
    "sim-square": lambda x: x * x,
    "sim-crunch": lambda x: 3 * x + 1,
}


@dex.activity(name="sim-charge", retry=FAST_RETRY, lock_timeout=timedelta(seconds=20))
def charge(order_id: str, amount: int) -> str:
    current_world().perform("sim-charge", (order_id, amount))
    return str(RESULTS["sim-charge"](order_id, amount))


@dex.activity(name="sim-ship", retry=FAST_RETRY, lock_timeout=timedelta(seconds=20))
def ship(order_id: str) -> str:
    current_world().perform("sim-ship", (order_id,))
    return str(RESULTS["sim-ship"](order_id))


@dex.activity(name="sim-refund", retry=PATIENT_RETRY, lock_timeout=timedelta(seconds=20))
def refund(order_id: str, amount: int) -> str:
    current_world().perform("sim-refund", (order_id, amount))
    return str(RESULTS["sim-refund"](order_id, amount))


@dex.activity(name="sim-square", retry=FAST_RETRY, lock_timeout=timedelta(seconds=10))
def square(x: int) -> int:
    current_world().perform("sim-square", (x,))
    return int(RESULTS["sim-square"](x))


@dex.activity(name="sim-crunch", retry=FAST_RETRY, lock_timeout=timedelta(seconds=10))
def crunch(x: int) -> int:
    dex.activity_context().heartbeat()  # a long computation says it is alive
    current_world().perform("sim-crunch", (x,))
    return int(RESULTS["sim-crunch"](x))


def issue_token() -> int:
    """A side effect: a number the run cannot compute again (it comes from the world)."""
    return current_world().rng.randrange(10**6)


# -- workflows ---------------------------------------------------------------------------------


@dex.workflow(name="sim-order")
async def order(ctx: dex.WorkflowContext, order_id: str, amount: int) -> dict[str, Any]:
    """Charge, wait a random while, ship; refund when shipping fails for good."""
    try:
        receipt: str = await ctx.activity(charge, order_id, amount)
    except dex.ActivityFailedError:
        return {"order": order_id, "status": "declined"}
    await ctx.sleep(timedelta(seconds=ctx.random().randint(1, 20)))
    try:
        parcel: str = await ctx.activity(ship, order_id)
    except dex.ActivityFailedError:
        await ctx.activity(refund, order_id, amount)  # if the refund fails too, the run fails
        return {"order": order_id, "status": "refunded", "receipt": receipt}
    return {"order": order_id, "status": "shipped", "receipt": receipt, "parcel": parcel}


@dex.workflow(name="sim-approval")
async def approval(ctx: dex.WorkflowContext, request: str) -> str:
    """Wait for a decision (or give up after a minute); ship when approved."""
    ctx.set_status("waiting")
    try:
        decision: str = await ctx.wait_for_event("decision", timeout=timedelta(seconds=60))
    except dex.WaitTimeoutError:
        return "expired"
    ctx.set_status(f"decided:{decision}")
    if decision == "yes":
        await ctx.activity(ship, request)
    return decision


async def _leg(ctx: dex.WorkflowContext, x: int) -> int:
    value: int = await ctx.activity(crunch, x)
    await ctx.sleep(1 + x % 3)
    return value


@dex.workflow(name="sim-fanout")
async def fanout(ctx: dex.WorkflowContext, xs: list[int]) -> dict[str, Any]:
    """Square every x at once (a failure leaves the others pending); draw a token, and after
    a pause run two coroutine legs, one on the first x and one on the token."""
    try:
        squares: list[int] | None = await ctx.gather(*(ctx.activity(square, x) for x in xs))
    except dex.ActivityFailedError:
        squares = None
    token: int = ctx.side_effect("token", issue_token)
    await ctx.sleep(1)  # the token is used in a later task than the one that drew it
    legs: list[int] = await ctx.gather(_leg(ctx, xs[0]), _leg(ctx, token % 10))
    return {"squares": squares, "legs": legs, "token": token}


@dex.workflow(name="sim-leaf")
async def leaf(ctx: dex.WorkflowContext, x: int) -> int:
    """A child: sleep, crunch, and fail for every x that is 3 modulo 5."""
    await ctx.sleep(1 + x % 4)
    value: int = await ctx.activity(crunch, x)
    if x % 5 == 3:
        raise ValueError(f"leaf {x} fails")
    return value


@dex.workflow(name="sim-parent")
async def parent(ctx: dex.WorkflowContext, xs: list[int]) -> list[Any]:
    """Start a child per x at once, then collect them in order."""
    children = [ctx.child(leaf, x) for x in xs]
    results: list[Any] = []
    for child in children:
        try:
            results.append(await child)
        except dex.ChildWorkflowFailedError:
            results.append("failed")
    return results


@dex.workflow(name="sim-ticker")
async def ticker(ctx: dex.WorkflowContext, rounds: int, total: int) -> int:
    """Per round, add the square of a tick (0 when none comes in 30 s); continue as new."""
    try:
        tick: int = await ctx.wait_for_event("tick", timeout=timedelta(seconds=30))
    except dex.WaitTimeoutError:
        tick = 0
    total += await ctx.activity(square, tick)
    if rounds > 1:
        ctx.continue_as_new(rounds - 1, total)
    return total


WORKFLOWS: tuple[Callable[..., Any], ...] = (order, approval, fanout, leaf, parent, ticker)
ACTIVITIES: tuple[Callable[..., Any], ...] = (charge, ship, refund, square, crunch)
WORKFLOW_BY_NAME: dict[str, Callable[..., Any]] = {getattr(fn, WORKFLOW_ATTRIBUTE).name: fn for fn in WORKFLOWS}


# -- starting runs, sending events, judging outcomes ---------------------------------------------


class Workload:
    """Which runs a simulation starts, which events it sends them, and what they must return.

    - ``continue_as_new``: tickers run several rounds, continuing as new between them (off:
      one round).
    - ``control_continuing_runs``: clients may cancel and suspend tickers, also while they are
      continuing as new (on by default; this once lost requests, see
      ``tests/simulation/test_regressions.py``).
    """

    workflows = WORKFLOWS
    activities = ACTIVITIES
    # the workflows whose code catches a cancel and runs a cleanup step, by the step's name
    # (``invariants.check_cleanup_before_end``); and those whose result lists the events of an
    # id they read (``invariants.check_events_not_lost``); none here
    cleanups: Mapping[str, str] = {}
    reads: Mapping[str, str] = {}

    def __init__(self, *, continue_as_new: bool = True, control_continuing_runs: bool = True) -> None:
        self.continue_as_new = continue_as_new
        self.control_continuing_runs = control_continuing_runs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(continue_as_new={self.continue_as_new}, "
            f"control_continuing_runs={self.control_continuing_runs})"
        )

    def workflow(self, name: str) -> Callable[..., Any]:
        return WORKFLOW_BY_NAME[name]

    def activity_result(self, name: str, args: list[Any]) -> Any:
        return RESULTS[name](*args)

    def accepts_requests(self, workflow_name: str) -> bool:
        """Whether clients may cancel or suspend runs of ``workflow_name``."""
        return workflow_name != "sim-ticker" or self.control_continuing_runs or not self.continue_as_new

    def start(self, engine: dex.Engine, rng: random.Random, serial: int) -> str:
        """Start one top-level run, chosen by ``rng``; return its id."""
        kind = rng.choice(["order", "order", "approval", "fanout", "parent", "ticker"])
        if kind == "order":
            key = rng.choice([None, "customer-1", "customer-2"])
            return engine.start_workflow(order, f"o{serial}", rng.randint(1, 99), concurrency_key=key)
        if kind == "approval":
            return engine.start_workflow(approval, f"a{serial}")
        if kind == "fanout":
            return engine.start_workflow(fanout, [rng.randint(0, 9) for _ in range(rng.randint(1, 3))])
        if kind == "parent":
            return engine.start_workflow(parent, [rng.randint(0, 9) for _ in range(rng.randint(1, 3))])
        rounds = rng.randint(1, 3)
        return engine.start_workflow(ticker, rounds if self.continue_as_new else 1, 0)

    def takes_updates(self, workflow_name: str) -> bool:
        """Whether clients send updates to runs of ``workflow_name`` (none here)."""
        return False

    def update_for(self, rng: random.Random) -> tuple[str, tuple[Any, ...]]:
        """An update (name, arguments) to send to a run that takes them."""
        raise NotImplementedError

    def cancels_often(self, workflow_name: str) -> bool:
        """Whether clients cancel runs of ``workflow_name`` often (not only now and then)."""
        return False

    def listens(self, workflow_name: str) -> bool:
        """Whether runs of ``workflow_name`` wait for external events."""
        return workflow_name in ("sim-approval", "sim-ticker")

    def event_for(self, workflow_name: str, rng: random.Random) -> tuple[str, Any] | None:
        """An event worth sending to a run of ``workflow_name`` (None: it waits for none)."""
        if workflow_name == "sim-approval":
            return "decision", rng.choice(["yes", "no"])
        if workflow_name == "sim-ticker":
            return "tick", rng.randint(1, 9)
        if workflow_name == "sim-order" and rng.random() < 0.2:
            return "noise", None  # buffered and never awaited: the run must not mind
        return None

    def check_outcome(self, record: RunRecord, inputs: list[Any], result: Any) -> str | None:
        """What is wrong with how the run ended, or None. ``result`` is decoded."""
        if record.status is RunStatus.CANCELLED:
            return None
        if record.status is RunStatus.FAILED:
            assert record.failure is not None
            allowed = {
                "sim-order": {"ActivityFailedError"},
                "sim-fanout": {"ActivityFailedError"},
                "sim-approval": {"ActivityFailedError"},
                "sim-leaf": {"ActivityFailedError", "ValueError"},
                "sim-ticker": {"ActivityFailedError"},
            }
            if record.failure.type not in allowed.get(record.workflow_name, set()):
                return f"failed with {record.failure.type}: {record.failure.message}"
            if record.workflow_name == "sim-leaf" and record.failure.type == "ValueError" and inputs[0] % 5 != 3:
                return "a leaf failed that must not"
            return None
        return self._check_result(record.workflow_name, inputs, result)

    def _check_result(self, name: str, inputs: list[Any], result: Any) -> str | None:
        expected: Any
        match name:
            case "sim-order":
                order_id, amount = inputs
                receipt = RESULTS["sim-charge"](order_id, amount)
                allowed = [
                    {"order": order_id, "status": "declined"},
                    {"order": order_id, "status": "refunded", "receipt": receipt},
                    {"order": order_id, "status": "shipped", "receipt": receipt, "parcel": f"parcel:{order_id}"},
                ]
                return None if result in allowed else f"{result!r} is none of {allowed!r}"
            case "sim-approval":
                return None if result in ("yes", "no", "expired") else f"unexpected decision {result!r}"
            case "sim-fanout":
                (xs,) = inputs
                legs = [3 * xs[0] + 1, 3 * (result["token"] % 10) + 1]
                if result["squares"] not in (None, [x * x for x in xs]) or result["legs"] != legs:
                    return f"fan-out of {xs} gave {result!r}"
                return None
            case "sim-leaf":
                (x,) = inputs
                expected = 3 * x + 1
            case "sim-parent":
                (xs,) = inputs
                # a leaf of x = 3 (mod 5) fails; any leaf may fail for good or be cancelled
                expected = ["failed" if x % 5 == 3 else 3 * x + 1 for x in xs]
                if len(result) != len(xs) or any(r not in (e, "failed") for r, e in zip(result, expected, strict=True)):
                    return f"children of {xs} gave {result!r}"
                return None
            case "sim-ticker":
                return None if isinstance(result, int) and result >= 0 else f"ticker total {result!r}"
            case _:
                return f"unknown workflow {name!r}"
        return None if result == expected else f"expected {expected!r}, got {result!r}"


STANDARD_WORKLOAD = Workload()
