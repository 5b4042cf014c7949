"""The values a remote worker's calls carry (docs/reference/contract.md §13), and the checks they pass before any of
them reaches the store: a name or worker id with a NUL or a lone surrogate, a count or a number
of seconds out of range, is refused with :class:`~dex.remote.errors.InvalidValueError`, naming
the field; a value of the wrong type with :class:`~dex.remote.errors.InvalidRequestError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from dex.remote.errors import InvalidRequestError, InvalidValueError, TaskNotFoundError

MAX_TEXT = 1000  # characters in a worker id or an activity name
MAX_NAMES = 100  # activity names in one poll
MAX_TASKS = 100  # tasks one poll may claim
MAX_WAIT_SECONDS = 60.0  # the longest long-poll
_MAX_TASK_ID = 2**63 - 1  # a PostgreSQL bigint


@attrs.frozen(kw_only=True)
class PolledTask:
    """A task a poll claimed for the worker: its arguments as JSON values, and its lease."""

    task_id: int
    run_id: str
    name: str
    attempt: int
    args: tuple[Any, ...]
    lease_version: int  # the claim's random token (below 2**53): the later calls name the lease with it
    lease_until: datetime
    heartbeat_timeout: float  # seconds: the lease lapses this long after the claim or a heartbeat


@attrs.frozen(kw_only=True)
class RemoteFailure:
    """The error a worker reports with ``fail``: retried under the task's retry policy unless
    ``terminal`` (or out of attempts), after ``retry_after_seconds`` when given."""

    type: str
    message: str
    terminal: bool = False
    retry_after_seconds: float | None = None


def text(value: object, field: str) -> str:
    """A non-empty string that PostgreSQL can store (no NUL, no lone surrogate)."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidValueError(f"{field} must not be empty")
    if len(value) > MAX_TEXT:
        raise InvalidValueError(f"{field} is longer than {MAX_TEXT} characters")
    if "\x00" in value:
        raise InvalidValueError(f"{field} must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValueError(f"{field} holds a lone surrogate, which is not valid Unicode") from None
    return value


def names(value: object) -> frozenset[str]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise InvalidRequestError(f"names must be a list of activity names, got {type(value).__name__}")
    if not value:
        raise InvalidValueError("names must name at least one activity")
    if len(value) > MAX_NAMES:
        raise InvalidValueError(f"names may hold at most {MAX_NAMES} activity names")
    return frozenset(text(name, "names[]") for name in value)


def count(value: object, field: str, most: int) -> int:
    value = _integral(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"{field} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= most:
        raise InvalidValueError(f"{field} must be between 1 and {most}, got {value}")
    return value


def seconds(value: object, field: str, most: float | None = None) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidRequestError(f"{field} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (most is not None and value > most):
        bound = f" and at most {most:g}" if most is not None else ""
        raise InvalidValueError(f"{field} must be a finite number of seconds, at least 0{bound}, got {value!r}")
    return float(value)


def _integral(value: object) -> object:
    """``49.0`` as 49: JSON has one kind of number, and JSON Schema calls an integral one an integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def task_id(value: object) -> int:
    """A task id from a path or a message: a positive integer (else no task has it: 404)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_TASK_ID:
        raise TaskNotFoundError(f"there is no activity task {str(value)[:40]!r}")
    return value


def lease_version(value: object) -> int:
    """The lease token a poll handed out with the task (any other integer holds no lease: 409)."""
    value = _integral(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"lease_version must be an integer, got {type(value).__name__}")
    return value


def failure(value: RemoteFailure) -> RemoteFailure:
    """The failure with its texts checked: a type is needed; NUL and lone surrogates are kept
    (the failure is stored as protobuf bytes; a lone surrogate becomes its visible escape)."""
    if not isinstance(value.type, str) or not isinstance(value.message, str):
        raise InvalidRequestError("error.type and error.message must be strings")
    if not value.type:
        raise InvalidValueError("error.type must not be empty")
    if not isinstance(value.terminal, bool):
        raise InvalidRequestError("error.terminal must be true or false")
    if value.retry_after_seconds is not None:
        seconds(value.retry_after_seconds, "error.retry_after_seconds", 366 * 24 * 3600.0)
    return value
