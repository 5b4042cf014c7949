"""Held runs (docs/reference/contract.md §11): a run whose history its code no longer matches waits for code that does.

A deploy can change workflow code under runs in flight. When the code, replayed, asks for other
steps than the history recorded (a ``NonDeterminismError``), or cannot read the history at all
(an ``UnreadableHistoryError``: bytes this version does not understand), nothing about the run
is wrong that the run itself could fix: failing it would lose its progress for a mistake of the
deploy. So by default the *task* fails instead — it is given back with the backoff of any
machinery failure (``WorkflowWorker.retry_later``: 1 s doubling to at most every 5 minutes),
and the run stays RUNNING with ``RunInfo.task_failure`` saying why. Once code that matches the
history is registered (on any engine), the next claim replays it and the run goes on, losing
nothing; the first result applied clears ``task_failure``. ``Engine(on_nondeterminism="fail")``
keeps the old behaviour: the run fails with the error.

This module holds the choice and the failure values; the worker decides where they apply.
"""

from __future__ import annotations

import logging
import random

from dex.app.machinery.backoff import TASK_RETRY
from dex.app.ports.store import Store, WorkflowTask
from dex.app.ports.telemetry import Telemetry
from dex.domain.replay import WorkflowExecutor
from dex.domain.values import FailureInfo

log = logging.getLogger("dex.worker")

ON_NONDETERMINISM = ("hold", "fail")


def give_back(
    store: Store,
    telemetry: Telemetry,
    rng: random.Random,
    task: WorkflowTask,
    reason: str,
    exc: BaseException | None,
    failure: FailureInfo | None,
) -> bool:
    """``WorkflowWorker.retry_later``: log, count, and give ``task`` back after ``TASK_RETRY``'s
    backoff for its claims (the lease version counts them); with ``failure``, its run is held."""
    delay = TASK_RETRY.next_delay(max(1, task.lease.version), rng) or TASK_RETRY.max_delay
    log.warning(
        "workflow task %s of run %s failed and is retried in %.1f s: %s",
        task.task_id,
        task.run_id,
        delay.total_seconds(),
        reason,
        exc_info=exc is not None and not isinstance(exc, ConnectionError),
        extra={"run_id": task.run_id, "workflow_name": task.workflow_name},
    )
    telemetry.task_finished("workflow", task.workflow_name, "retried", 0.0)
    try:
        now = store.clock.now()
        return store.retry_workflow_tasks([(task, now + delay)], now, failure)[0]
    except Exception:
        log.info("could not give back workflow task %s; its lease will expire", task.task_id, exc_info=True)
        return False


def holds_runs(on_nondeterminism: object) -> bool:
    """``Engine(on_nondeterminism=)``, checked: True for "hold" (the default), False for "fail"."""
    if not isinstance(on_nondeterminism, str) or on_nondeterminism not in ON_NONDETERMINISM:
        raise ValueError(f'on_nondeterminism must be "hold" or "fail", got {on_nondeterminism!r}')
    return on_nondeterminism == "hold"


def mismatch(executor: WorkflowExecutor) -> FailureInfo | None:
    """Why a replayed executor cannot go on with this code (its non-determinism), or None."""
    if executor.nondeterminism is None:
        return None
    # terminal: retrying the same code gives the same answer; the run waits for other code
    return FailureInfo(type="NonDeterminismError", message=executor.nondeterminism, terminal=True)


def unreadable(message: str) -> FailureInfo:
    """The failure of a task whose history this code cannot decode."""
    return FailureInfo(type="UnreadableHistoryError", message=message, terminal=True)
