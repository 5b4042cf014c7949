"""What a start with an ``instance_id`` does when that id has been used before
(docs/reference/contract.md §15): ``id_reuse`` for ended runs, ``debounce`` for a run not yet started.

A :class:`StartRule` is checked where the start enters (:func:`start_rule`); the store finds the
id's latest run (:class:`LatestRun`), and :func:`decide` says, the same for every adapter, whether
that run's id is the answer (:class:`Reuse`), a new run is made (:class:`Create`) or the waiting
run takes the new arguments and a new start time (:class:`Debounce`). The store makes the lookup
and the write one step with respect to other starts of the same id (a lock on the id), so two
starts racing with ``"never"`` make one run.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import attrs

from dex.domain.status import RunStatus

IdReuse = Literal["allow", "failed_only", "never"]
ID_REUSE: tuple[IdReuse, ...] = ("allow", "failed_only", "never")

# the ends after which "failed_only" makes a new run: the last run did not succeed
NOT_SUCCEEDED = frozenset({RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TERMINATED})


@attrs.frozen(kw_only=True, slots=True)
class StartRule:
    """How a start treats its ``instance_id``'s earlier runs. The default (``allow``, no
    debounce) is the plain start: only a live run is reused."""

    id_reuse: IdReuse = "allow"
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None

    @property
    def plain(self) -> bool:
        """Whether the store's ordinary start (a live run wins, nothing else looked at) does it."""
        return self.id_reuse == "allow" and self.debounce is None


PLAIN = StartRule()


def start_rule(
    instance_id: str | None,
    id_reuse: object = "allow",
    debounce: object = None,
    debounce_max: object = None,
) -> StartRule:
    """The checked rule of a start, or ``TypeError``/``ValueError`` naming what is wrong (before
    anything is written). ``instance_id`` is the start's, already checked."""
    if type(id_reuse) is str and id_reuse == "allow" and debounce is None and debounce_max is None:
        return PLAIN  # every start's rule unless it says otherwise: no more to check
    if not isinstance(id_reuse, str):
        raise TypeError(f"id_reuse must be one of {', '.join(map(repr, ID_REUSE))}, got {type(id_reuse).__name__}")
    # its characters, as a plain str: a subclass's own __eq__ or __hash__ is not asked (it may raise)
    id_reuse = str.__str__(id_reuse)
    if id_reuse not in ID_REUSE:
        raise ValueError(f"id_reuse must be one of {', '.join(map(repr, ID_REUSE))}, got {_shown(id_reuse)}")
    if debounce is None and debounce_max is not None:
        raise ValueError("debounce_max needs debounce: it caps how far debounced starts push a run's start")
    if debounce is not None:
        debounce = _duration(debounce, "debounce")
        if debounce_max is not None:  # shorter than debounce: the run starts debounce_max after the first start
            debounce_max = _duration(debounce_max, "debounce_max")
    if instance_id is None and (id_reuse != "allow" or debounce is not None):
        what = "debounce" if debounce is not None else f"id_reuse={id_reuse!r}"
        raise ValueError(f"{what} needs an instance_id: it says what a start with an id used before does")
    if id_reuse == "allow" and debounce is None:
        return PLAIN
    return StartRule(id_reuse=id_reuse, debounce=debounce, debounce_max=debounce_max)  # type: ignore[arg-type]


def _duration(value: object, field: str) -> timedelta:
    if not isinstance(value, timedelta):
        raise TypeError(f"{field} must be a datetime.timedelta, got {type(value).__name__}")
    # its value as a plain timedelta: a subclass's own operators are not asked (they may raise)
    value = timedelta.__add__(timedelta(0), value)
    if value < timedelta(0):
        raise ValueError(f"{field} must not be negative, got {value}")
    return value


def _shown(value: str) -> str:
    text = repr(value)  # escapes NUL and surrogates, so the message is printable and storable
    return text if len(text) <= 80 else f"{text[:77]}..."


@attrs.frozen(kw_only=True, slots=True)
class LatestRun:
    """What the store knows of the run an ``instance_id`` names: the live one if any, else the
    newest. ``waiting`` is true while it may still be debounced: CREATED, its history only
    ``RunCreated``, its start not yet due, nothing else sent to it and no workflow task made
    for it (so no worker holds its arguments)."""

    run_id: str
    workflow_name: str
    status: RunStatus
    created_at: datetime
    waiting: bool


@attrs.frozen(slots=True)
class Reuse:
    """The answer is this existing run's id; nothing is written."""

    run_id: str


@attrs.frozen(slots=True)
class Create:
    """Make a new run; its start is due at ``start_at``."""

    start_at: datetime


@attrs.frozen(slots=True)
class Debounce:
    """The waiting run ``run_id`` takes the new arguments; its start is due at ``start_at``."""

    run_id: str
    start_at: datetime


Decision = Reuse | Create | Debounce


def decide(latest: LatestRun | None, rule: StartRule, workflow_name: str, now: datetime) -> Decision:
    """What a start under ``rule`` of ``workflow_name`` does, given the id's latest run."""
    if latest is None:
        return Create(_start_at(rule, now, now))
    if not latest.status.is_terminal:
        # a waiting run of another workflow keeps its own arguments: they would not fit
        if rule.debounce is not None and latest.waiting and latest.workflow_name == workflow_name:
            return Debounce(latest.run_id, _start_at(rule, latest.created_at, now))
        return Reuse(latest.run_id)
    if rule.id_reuse == "never" or (rule.id_reuse == "failed_only" and latest.status not in NOT_SUCCEEDED):
        return Reuse(latest.run_id)
    return Create(_start_at(rule, now, now))


def _start_at(rule: StartRule, first: datetime, now: datetime) -> datetime:
    """``now + debounce``, never past ``debounce_max`` after the ``first`` start (``now`` without debounce)."""
    if rule.debounce is None:
        return now
    due = now + rule.debounce
    if rule.debounce_max is not None:
        due = min(due, max(first + rule.debounce_max, now))
    return due
