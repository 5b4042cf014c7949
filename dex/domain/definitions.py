"""What the decorators register: workflow and activity definitions, and the converter port.

Definitions are plain values; the core reads their options and type hints, never the
decorators themselves.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import attrs

from dex.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from dex.domain.values import Payload

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
QUEUE_PATTERN = re.compile(r"^[a-z0-9_-]{1,40}$")
DEFAULT_QUEUE = "default"
DEFAULT_LOCK_TIMEOUT = timedelta(minutes=5)
# the isolation levels a transaction step may ask for (docs/reference/contract.md §9), as PostgreSQL spells them
ISOLATION_LEVELS = ("read committed", "repeatable read", "serializable")


def validate_text(value: object, field: str) -> str:
    """Return ``value`` if it is a str PostgreSQL can store as text, else raise naming ``field``.

    A ``TypeError`` for anything but a str; a ``ValueError`` for a NUL character (a text column
    refuses it, and libpq would cut the value short there) or a code point that has no UTF-8
    form (a lone surrogate, which no client can send). Refused where it enters, such a value
    cannot reach a batch of writes and fail it for the other runs in it (docs/reference/contract.md §8).
    """
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{field} must be a str, got {type(value).__name__} {_shown(value)}")
        value = str.__str__(value)  # a str subclass: store its plain text
    if "\x00" in value:
        raise ValueError(f"{field} must not contain a NUL character (\\x00): {_shown(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{field} must be valid Unicode text, but it holds a lone surrogate "
                f"{value[exc.start]!r} at index {exc.start}: {_shown(value)}"
            ) from None
    return value


def validate_optional_text(value: object, field: str) -> str | None:
    """``validate_text``, where None (not given) is allowed too."""
    return None if value is None else validate_text(value, field)


def validate_key(value: object, field: str) -> str | None:
    """An ``instance_id`` or ``concurrency_key``: None, or a storable str of 1 to 256 characters."""
    if value is None:
        return None
    text = validate_text(value, field)
    if not text or len(text) > 256:
        raise ValueError(f"{field} must be a non-empty str of at most 256 characters, got {_shown(text)}")
    return text


def _shown(value: object) -> str:
    try:
        text = repr(value)  # escapes NUL and surrogates: the message itself stays printable and storable
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not hide the error being reported
        return f"<{type(value).__name__} object>"
    return text if len(text) <= 80 else f"{text[:77]}..."


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` if it is a valid workflow, activity or event name, else raise ValueError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid {what} {_shown(name)}: it must match {NAME_PATTERN.pattern}")
    return name


def validate_queue(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name, else raise ValueError."""
    if not isinstance(queue, str) or not QUEUE_PATTERN.fullmatch(queue):
        raise ValueError(f"invalid queue name {_shown(queue)}: it must match {QUEUE_PATTERN.pattern}")
    return queue


def validate_priority(priority: object) -> int:
    """Return ``priority`` if it is an int in 0..100, else raise ValueError."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        raise ValueError(f"invalid priority {priority!r}: it must be an int from 0 to 100")
    return priority


class PayloadConverter(Protocol):
    """Turns Python values into payloads and back; the hint guides decoding."""

    def encode(self, value: object) -> Payload: ...

    def decode(self, payload: Payload, hint: object = None) -> Any: ...


@attrs.frozen(kw_only=True)
class Signature:
    """The type hints of a function's positional parameters and of its return value."""

    parameters: tuple[object, ...]
    returns: object
    accepts_varargs: bool
    required: int

    @classmethod
    def of(cls, fn: Callable[..., Any], *, skip: int = 0) -> Signature:
        """Read ``fn``'s signature; ``skip`` leading parameters (a workflow's context) are left out."""
        sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001 - an unresolvable forward reference: the others still count
            hints = _resolvable_hints(fn)
        params = list(sig.parameters.values())[skip:]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return cls(
            parameters=tuple(hints.get(p.name) for p in positional),
            returns=hints.get("return"),
            accepts_varargs=any(p.kind == p.VAR_POSITIONAL for p in params),
            required=sum(1 for p in positional if p.default is p.empty),
        )

    def check_arity(self, count: int, what: str) -> None:
        """Raise TypeError naming ``what`` when ``count`` positional arguments do not fit."""
        if count < self.required or (not self.accepts_varargs and count > len(self.parameters)):
            expected = (
                f"at least {self.required}"
                if self.accepts_varargs
                else (
                    str(self.required)
                    if self.required == len(self.parameters)
                    else f"{self.required} to {len(self.parameters)}"
                )
            )
            raise TypeError(f"{what} takes {expected} argument(s), got {count}")

    def hint_for(self, index: int) -> object:
        return self.parameters[index] if index < len(self.parameters) else None


def _resolvable_hints(fn: Callable[..., Any]) -> dict[str, object]:
    """The hints of ``fn`` that resolve, one by one: a return hint naming a class imported only
    under ``TYPE_CHECKING`` must not cost the parameters their types (those decode without a hint)."""
    hints: dict[str, object] = {}
    namespace = getattr(inspect.unwrap(fn), "__globals__", {})
    try:
        annotations = inspect.get_annotations(fn)
    except Exception:  # noqa: BLE001 - annotations that cannot even be read: no hints at all
        return hints
    for name, annotation in annotations.items():
        try:
            # what typing.get_type_hints does for each, evaluated in the function's module
            hints[name] = typing.get_type_hints(_Annotated(annotation), namespace)["hint"]
        except Exception:  # noqa: BLE001 - this one stays without a hint
            continue
    return hints


class _Annotated:
    """An object with one annotation, for :func:`typing.get_type_hints` to resolve alone."""

    def __init__(self, annotation: object) -> None:
        self.__annotations__ = {"hint": annotation}


@attrs.frozen(kw_only=True)
class WorkflowDefinition:
    """A registered workflow: its name, default queue and code."""

    name: str = attrs.field(validator=lambda _i, _a, v: validate_name(v, "workflow name"))
    fn: Callable[..., Any] = attrs.field(eq=False)
    queue: str = attrs.field(default=DEFAULT_QUEUE, validator=lambda _i, _a, v: validate_queue(v))
    signature: Signature = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class ActivityDefinition:
    """A registered activity: its name, default queue, retry policy, lease length and code."""

    name: str = attrs.field(validator=lambda _i, _a, v: validate_name(v, "activity name"))
    fn: Callable[..., Any] = attrs.field(eq=False)
    queue: str = attrs.field(default=DEFAULT_QUEUE, validator=lambda _i, _a, v: validate_queue(v))
    retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT
    signature: Signature = attrs.field(eq=False)
    is_async: bool = False
    # a transaction step (``@dex.transaction``): its isolation level; None for an ordinary activity
    isolation: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(ISOLATION_LEVELS))
    )
