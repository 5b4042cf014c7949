"""Held runs (SPEC §11): a run whose history its code no longer matches waits for code that does.

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

import attrs

from dex.domain.replay import WorkflowExecutor
from dex.domain.task import WorkflowTaskResult
from dex.domain.values import FailureInfo
from dex.serialization.history import encode_ahead

log = logging.getLogger("dex.worker")

ON_NONDETERMINISM = ("hold", "fail")


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


def describe(exc: BaseException) -> str:
    """``Type: message`` of a machinery error, for the log (a message that cannot be had is said so)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises still gets described
        text = "<message unavailable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def encoded_ahead(result: WorkflowTaskResult) -> WorkflowTaskResult:
    """The result, its block encoded now and carried on its events (else left to the flusher)."""
    try:
        return attrs.evolve(result, new_events=encode_ahead(result.new_events))
    except Exception:
        log.debug("could not encode the result of run %s ahead of its flush", result.run_id, exc_info=True)
        return result
