"""What the PostgreSQL adapter cannot store, the in-memory adapter refuses too (docs/reference/contract.md §8).

The PostgreSQL adapter keeps a run's identity and metadata in ``text`` columns (run ids, names,
queues, ``instance_id``, ``concurrency_key``, ``custom_status``, owners), its labels in a
``jsonb`` column, and events, messages, payloads and failures as protobuf bytes (``bytea``).
The server refuses a NUL in ``text`` and ``\\u0000`` in ``jsonb``; the client cannot encode a
lone surrogate at all, neither for a text parameter nor in a protobuf string; a NUL inside
protobuf bytes is just a byte. A write that holds such a value fails as a whole there.

The engine refuses these values where they enter, so a store should never see one. These
checks are the defence in depth that keeps the in-memory adapter from accepting what
PostgreSQL would refuse (so tests over memory cannot pass where PostgreSQL stalls): each
raises ``ValueError`` naming the field, before the operation changes anything. For the writes
the engine's buffer makes (results, outcomes, messages, heartbeats) the error is also a
:class:`~dex.app.ports.store.StoreRejectedError` (:class:`RefusedValueError`), as the PostgreSQL
adapter raises there, so the buffer splits such a batch instead of keeping it forever.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import ParamSpec

import attrs

from dex.app.ports.store import ActivityOutcome, ActivityTask, StoreRejectedError
from dex.domain import events as ev
from dex.domain.definitions import validate_text
from dex.domain.task import WorkflowTaskResult

P = ParamSpec("P")


class RefusedValueError(StoreRejectedError, ValueError):
    """A value PostgreSQL would refuse, in a write the buffer makes: the ``ValueError`` naming
    the field, and the ``StoreRejectedError`` that the buffer answers by splitting its batch."""


def _batch_write(check: Callable[P, None]) -> Callable[P, None]:
    """The check of a buffered write: its ValueError becomes a RefusedValueError."""

    @functools.wraps(check)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            check(*args, **kwargs)
        except ValueError as exc:
            raise RefusedValueError(str(exc)) from exc

    return checked


def text(value: object, field: str) -> None:
    """A value of a text column: no NUL, no lone surrogate."""
    if value is not None:
        validate_text(value, field)


def texts(values: Iterable[object], field: str) -> None:
    """The elements of a text array (the names a claim asks for)."""
    for value in values:
        text(value, field)


def labels(pairs: ev.Labels, field: str = "labels") -> None:
    """Labels, stored as jsonb: the server refuses ``\\u0000`` there as in text."""
    for key, value in pairs:
        text(key, f"{field} key")
        text(value, f"{field}[{key!r}] value")


def protobuf(value: object, field: str) -> None:
    """A value stored as protobuf bytes: every string in it must have a UTF-8 form."""
    where = _unencodable(value)
    if where is not None:
        raise ValueError(f"{field}{where} must be valid Unicode text: it holds a lone surrogate")


def created(run_id: str, event: ev.RunCreated, field: str = "run") -> None:
    """A run to create: its row's text columns, its labels and its ``RunCreated`` event."""
    text(run_id, "run_id")
    text(event.workflow_name, "workflow_name")
    text(event.queue, "queue")
    text(event.instance_id, "instance_id")
    text(event.concurrency_key, "concurrency_key")
    text(event.parent_run_id, "parent_run_id")
    text(event.code_version, "code_version")
    labels(event.labels)
    protobuf(event, field)


@_batch_write
def workflow_results(results: Sequence[tuple[object, WorkflowTaskResult]]) -> None:
    """A batch of workflow-task results: PostgreSQL writes it in one transaction, all or nothing."""
    for _task, result in results:
        text(result.custom_status, "custom_status")
        protobuf(result.new_events, "history event")
        if result.new_history is not None:
            protobuf(result.new_history, "history event")
        for child in result.child_runs:
            created(child.run_id, child.created, "child run")
        for spec in result.activity_tasks:
            text(spec.name, "activity name")
            text(spec.queue, "queue")
            protobuf(spec, "activity task")
        if result.completion is not None:
            protobuf(result.completion, "run outcome")
        if result.labels is not None:
            labels(result.labels)
        for run in result.detached_runs:
            created(run.run_id, run.created, "detached run")
        for message in result.messages:
            text(message.run_id, "run_id")
            protobuf(message.event, "message")
        for answer in result.update_answers:
            text(answer.update_id, "update id")
            protobuf(answer, "update answer")


@_batch_write
def activity_outcomes(outcomes: Sequence[ActivityOutcome]) -> None:
    """A batch of activity outcomes, written in one transaction."""
    for outcome in outcomes:
        protobuf(outcome.result, "activity result")
        protobuf(outcome.failure, "activity failure")


@_batch_write
def messages(items: Sequence[tuple[str, ev.Message]]) -> None:
    """A batch of messages, one statement in PostgreSQL: one bad item fails them all."""
    for run_id, message in items:
        text(run_id, "run_id")
        protobuf(message, "message")


@_batch_write
def heartbeats(tasks: Sequence[ActivityTask]) -> None:
    """A batch of heartbeats: the leases' owners are text."""
    for task in tasks:
        text(task.lease.owner, "owner")


def _unencodable(value: object) -> str | None:
    """Where in ``value`` (an attrs value, a tuple, a str) a string without a UTF-8 form sits
    (``""`` for ``value`` itself), or None."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return ""
        return None
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            where = _unencodable(item)
            if where is not None:
                return f"[{index}]{where}"
        return None
    names = _attribute_names(type(value))
    for name in names:
        where = _unencodable(getattr(value, name))
        if where is not None:
            return f".{name}{where}"
    return None


_NAMES: dict[type, tuple[str, ...]] = {}


def _attribute_names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(field.name for field in attrs.fields(cls)) if attrs.has(cls) else ()
    return names
