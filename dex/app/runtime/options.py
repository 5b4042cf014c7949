"""What a simulation or a test varies of an engine's runtime, as one value with production defaults.

A started engine times its rounds by ``time.monotonic``, runs activity attempts in a pool of
threads, watches workflow code with a watchdog that interrupts blocked threads, and draws its
backoff's jitter from fresh randomness. The deterministic simulator (:mod:`dex.simulation`)
runs the same runtime with a virtual clock, a pool whose attempts run when it says, a watchdog
it steps and seeded randomness, and observes the coordinator's decisions: it passes them here
(``Engine(runtime_options=...)``), and the runtime builds its parts with them. Nothing is set
on a part once it is built.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import attrs

from dex.app.activities.attempts import Durations
from dex.app.machinery.threads import AttemptPool, activity_pool
from dex.app.ports.store import WorkflowTask
from dex.app.runtime import coordinator as co

# threads where transaction steps' groups run (dex.app.workflows.step_groups): two groups under way at
# once keep the database busy while the workflow round decides (each holds a pooled connection);
# measured, 2 beat 3 and 1 in three alternated pairs each (docs/decisions/transaction-steps-in-groups.md)
GROUP_THREADS = 2

# the most activity tasks one claim takes (the coordinator reserves pool slots for as many)
ACTIVITY_BATCH = 16

# the most workflow tasks one round of the workflow worker runs
WORKFLOW_BATCH = 64


@attrs.frozen(kw_only=True)
class RuntimeOptions:
    """The parts of an engine's runtime that a simulation replaces (see the module docstring).

    For simulations and tests; an application leaves them alone. Each start of the engine
    (``Engine.start()``, or ``Runtime.arm()`` in a simulation) gets its attempt pool from
    ``attempt_pool`` (called with ``activity_concurrency``) and a watchdog on ``monotonic``.
    """

    # the clock of the rounds, the coordinator's events and the watchdog (seconds, any origin)
    monotonic: Callable[[], float] = time.monotonic
    # a start's pool for activity attempts, given the engine's activity_concurrency
    attempt_pool: Callable[[int], AttemptPool] = activity_pool
    # threads where transaction steps' groups go on (0: in the workflow round's own thread)
    group_threads: int = GROUP_THREADS
    # ``async def`` attempts wait on the engine's event loop (False: in the pool's call)
    await_on_loop: bool = True
    # the watchdog interrupts a thread blocked in workflow code (False: it only gives the task back)
    interrupt: bool = True
    # seconds the view of the activity queues' slots is kept (dex.app.workflows.inline.QueueView)
    slots_ttl: float = 1.0
    # the jitter of a workflow task given back with a backoff (None: fresh randomness)
    jitter: random.Random | None = None
    # the most workflow tasks one workflow round runs
    workflow_round: int = WORKFLOW_BATCH
    # the most activity tasks one claim of the activity round takes
    activity_claim: int = ACTIVITY_BATCH
    # drain() runs first attempts inline as a started engine does, of activities whose recent
    # attempts typically took at most these seconds (None: drain runs none inline)
    drain_inline: float | None = None
    # how long each activity's recent attempts took (which decides what runs inline)
    durations: Durations = attrs.Factory(Durations)
    # sees each of the coordinator's decisions: the event and the commands it produced
    observe: Callable[[co.Event, tuple[co.Command, ...]], None] | None = None
    # told of the workflow tasks a completion or a start claimed for this engine ("complete, then claim")
    handed: Callable[[Sequence[WorkflowTask]], None] | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("workflow_round", "activity_claim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.group_threads < 0:
            raise ValueError(f"group_threads must not be negative, got {self.group_threads!r}")
