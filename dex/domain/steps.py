"""The commands a workflow's steps become: what ``WorkflowContext`` is asked, checked and encoded.

Pure builders that the executor (``dex.domain.replay``) calls when workflow code asks for an
activity, a timer, a child or a gather: they find the step's definition, check its arguments
and its options, and make the command that replay then matches against the history (or
records as new). Nothing here knows where in the history the executor stands.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.coroutines import CoroutineStepper, DexFuture, resolved
from dex.domain.definitions import (
    ActivityDefinition,
    PayloadConverter,
    Signature,
    WorkflowDefinition,
    validate_name,
    validate_optional_text,
    validate_priority,
    validate_queue,
    validate_text,
)
from dex.domain.errors import SerializationError
from dex.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from dex.domain.values import Payload

ActivityLookup = Callable[[str], ActivityDefinition | None]
WorkflowLookup = Callable[[str], WorkflowDefinition | None]


def encode_arguments(converter: PayloadConverter, args: Sequence[Any], what: str = "argument") -> tuple[Payload, ...]:
    """``args`` as payloads; ``SerializationError`` naming the one that cannot be (``what`` and
    its index), raised where the values were sent (docs/reference/contract.md §2)."""
    payloads = []
    for index, arg in enumerate(args):
        try:
            payloads.append(converter.encode(arg))
        except SerializationError as exc:
            raise SerializationError(f"{what} {index}: {exc}") from exc
    return tuple(payloads)


def decode_arguments(
    converter: PayloadConverter, payloads: Sequence[Payload], signature: Signature, what: str = "argument"
) -> list[Any]:
    """``payloads`` decoded with ``signature``'s parameter hints; ``SerializationError`` naming
    the one that does not fit (``what`` and its index), raised at the receiver."""
    values = []
    hints = signature.parameters  # Signature.hint_for, without a call per argument
    for index, payload in enumerate(payloads):
        try:
            values.append(converter.decode(payload, hints[index] if index < len(hints) else None))
        except SerializationError as exc:
            raise SerializationError(f"{what} {index}: {exc}") from exc
    return values


def activity_command(
    fn_or_name: Callable[..., Any] | str,
    args: tuple[Any, ...],
    *,
    queue: str | None,
    retry: RetryPolicy | None,
    priority: int | None,
    run_priority: int,
    converter: PayloadConverter,
    lookup: ActivityLookup,
) -> tuple[cmd.ScheduleActivity, ActivityDefinition | None]:
    """The command scheduling an activity, and its definition when this process knows it."""
    definition = definition_of(fn_or_name, "__dex_activity__", lookup, "activity")
    name = definition.name if definition else validate_name(fn_or_name, "activity name")
    if definition is not None:
        definition.signature.check_arity(len(args), f"activity {name!r}")
    command = cmd.ScheduleActivity(
        name=name,
        input=encode_arguments(converter, args, f"activity {name!r} argument"),
        queue=validate_queue(queue) if queue is not None else (definition.queue if definition else "default"),
        priority=validate_priority(priority) if priority is not None else run_priority,
        retry_policy=retry or (definition.retry_policy if definition else DEFAULT_RETRY_POLICY),
        lock_timeout=definition.lock_timeout if definition else timedelta(minutes=5),
    )
    return command, definition


def child_command(
    fn_or_name: Callable[..., Any] | str,
    args: tuple[Any, ...],
    *,
    child_run_id: str,
    instance_id: str | None,
    queue: str | None,
    concurrency_key: str | None,
    priority: int | None,
    labels: Mapping[str, str] | None,
    run_priority: int,
    converter: PayloadConverter,
    lookup: WorkflowLookup,
) -> tuple[cmd.StartChild, WorkflowDefinition | None]:
    """The command starting a child run ``child_run_id``, and its definition when known here."""
    definition = definition_of(fn_or_name, "__dex_workflow__", lookup, "workflow")
    name = definition.name if definition else validate_name(fn_or_name, "workflow name")
    if definition is not None:
        definition.signature.check_arity(len(args), f"workflow {name!r}")
    command = cmd.StartChild(
        child_run_id=child_run_id,
        workflow_name=name,
        input=encode_arguments(converter, args, f"workflow {name!r} argument"),
        queue=validate_queue(queue) if queue is not None else (definition.queue if definition else "default"),
        # storable text only: no length rule here, which histories recorded before it would break
        instance_id=validate_optional_text(instance_id, "instance_id"),
        priority=validate_priority(priority) if priority is not None else run_priority,
        concurrency_key=validate_optional_text(concurrency_key, "concurrency_key"),
        labels=normalize_labels(labels),
    )
    return command, definition


def delay_of(delay: timedelta | float) -> timedelta:
    """A timer's delay as a timedelta: seconds or a timedelta, never negative."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        delay = timedelta(seconds=delay)
    if not isinstance(delay, timedelta):
        raise TypeError(f"a delay is a timedelta or a number of seconds, got {delay!r}")
    if delay < timedelta(0):
        raise ValueError(f"a delay cannot be negative, got {delay}")
    return delay


def gather(stepper: CoroutineStepper, awaitables: Sequence[Awaitable[Any]]) -> DexFuture[list[Any]]:
    """One future for several steps (coroutines are spawned on ``stepper``): results in order,
    or the first exception."""
    futures: list[DexFuture[Any]] = []
    for item in awaitables:
        if isinstance(item, DexFuture):
            futures.append(item)
        elif inspect.iscoroutine(item):
            futures.append(stepper.spawn(item, "gathered"))
        else:
            raise TypeError(f"gather takes WorkflowContext steps or coroutines, got {item!r}")
    if not futures:
        return resolved([], "gather")
    result: DexFuture[list[Any]] = DexFuture("gather")
    remaining = [len(futures)]

    def on_done(done: DexFuture[Any]) -> None:
        if result.done():
            return
        exc = done.exception()
        if exc is not None:
            result.set_exception(exc)
            return
        remaining[0] -= 1
        if remaining[0] == 0:
            result.set_result([f.result() for f in futures])

    for future in futures:
        future.add_done_callback(on_done)
    return result


def definition_of(
    fn_or_name: Callable[..., Any] | str,
    attribute: str,
    lookup: Callable[[str], Any],
    what: str,
) -> Any:
    """The definition a decorated function carries, or the one registered under a name."""
    if isinstance(fn_or_name, str):
        return lookup(fn_or_name)
    definition = getattr(fn_or_name, attribute, None)
    if definition is None:
        raise TypeError(f"{fn_or_name!r} is not a dex {what}: decorate it with @dex.{what} or pass its name")
    return definition


def normalize_labels(labels: Mapping[str, str] | None) -> ev.Labels:
    """Labels as a sorted tuple of pairs, checked to be storable strings (``validate_text``)."""
    if not labels:
        return ()
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    pairs = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            # the types only: a hostile key's repr() may raise, and the error must still be this one
            raise TypeError(
                f"labels must map str to str, got a {type(key).__name__} key with a {type(value).__name__} value"
            )
        key = validate_text(key, "labels key")
        pairs.append((key, validate_text(value, f"labels[{key!r}] value")))
    return tuple(sorted(pairs))
