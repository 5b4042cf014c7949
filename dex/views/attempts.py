"""A run's activity steps and their attempts (:class:`dex.ActivityStep`), as the command line,
the dashboard and the JSON API show them: a table of the steps, each step's newest failed and
lost attempts beneath it, and one JSON form for ``dex runs show --json`` and ``/v1``.

Failure texts come from user code: on a terminal a control character (a NUL, an escape
sequence) is shown escaped, and each failure is one line, shortened; the JSON form carries it
whole (it is bounded already, as every ``FailureInfo`` is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dex.app.facade.steps import RETRYING, RUNNING, UNKNOWN, ActivityStep
from dex.app.ports.store import FailedAttempt
from dex.domain.values import describe_failure
from dex.views.render import iso, jsonable, shorten, show_time, table

FAILURE_WIDTH = 160  # characters of a failure shown on its line


def attempts_text(step: ActivityStep) -> str:
    """``3 attempts (2 failed, 1 lost)``."""
    counts = [f"{n} {what}" for n, what in ((step.failed, "failed"), (step.lost, "lost")) if n]
    noun = "attempt" if step.attempts == 1 else "attempts"
    return f"{step.attempts} {noun}" + (f" ({', '.join(counts)})" if counts else "")


def when_text(step: ActivityStep) -> str:
    """What comes next for a live step: its next retry, or its attempt's lease; for a step of a
    page whose outcome was not read, that it lies further on."""
    if step.status == RETRYING and step.next_retry_at is not None:
        return f"next retry at {show_time(step.next_retry_at, millis=True)}"
    if step.status == RUNNING and step.lease_expires_at is not None:
        return f"lease until {show_time(step.lease_expires_at, millis=True)}"
    if step.status == UNKNOWN:
        return "its outcome, if any, lies further in the history than was read"
    return ""


def failure_line(attempt: FailedAttempt) -> str:
    """``attempt 2 failed at 2025-05-01T12:00:03.250Z: ConnectionError: timed out``."""
    text = shorten(visible(describe_failure(attempt.failure)), FAILURE_WIDTH)
    return f"attempt {attempt.attempt} {attempt.kind} at {show_time(attempt.at, millis=True)}: {text}"


def visible(text: str) -> str:
    """``text`` with control characters escaped (``\\x00``), so a terminal shows them as text."""
    return "".join(ch if ch >= " " or ch in "\n" else f"\\x{ord(ch):02x}" for ch in text)


def steps_text(steps: Sequence[ActivityStep]) -> str:
    """The steps as a table, each step's recent failed and lost attempts indented beneath it."""
    if not steps:
        return "no activity steps"
    rows = table(
        ("#", "ACTIVITY", "STATUS", "ATTEMPTS", "NEXT"),
        ((str(s.seq), shorten(s.name, 40), s.status, attempts_text(s), when_text(s)) for s in steps),
    ).split("\n")
    lines = [rows[0]]
    for step, row in zip(steps, rows[1:], strict=True):
        lines.append(row)
        lines.extend(f"    {failure_line(attempt)}" for attempt in step.recent)
    return "\n".join(lines)


def step_json(step: ActivityStep) -> dict[str, Any]:
    """A step as JSON (the ``/v1`` run's ``activity_steps`` and ``dex runs show --json``)."""
    return {
        "seq": step.seq,
        "name": step.name,
        "status": step.status,
        "attempts": step.attempts,
        "failed": step.failed,
        "lost": step.lost,
        "scheduled_at": iso(step.scheduled_at),
        "ended_at": jsonable(step.ended_at),
        "next_retry_at": jsonable(step.next_retry_at),
        "lease_expires_at": jsonable(step.lease_expires_at),
        "recent_failures": [
            {"attempt": a.attempt, "kind": a.kind, "at": iso(a.at), "failure": jsonable(a.failure)} for a in step.recent
        ],
    }
