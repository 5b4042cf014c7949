"""The engine registry port (docs/reference/contract.md §15): which started engines serve what.

A started engine keeps one row, :class:`EngineInfo`, keyed by its ``node_id``: its host, pid,
code version, the names it registers and the queues it serves. It writes the row when it
starts and again with its leader-election heartbeat (one statement per heartbeat period), each
time pushing ``expires_at`` forward; a graceful stop deletes it. A crashed engine's row is
no longer listed once ``expires_at`` has passed, and the next heartbeat of any engine deletes
it. ``expires_at`` is the writer's, so that a reader (the CLI, ``dex web``) needs no knowledge
of the engines' heartbeat periods.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import attrs

from dex.domain.definitions import validate_optional_text, validate_text


@attrs.frozen(kw_only=True)
class EngineInfo:
    """A live engine, as ``Engine.list_engines()`` lists it: ``workflows``, ``activities`` and
    ``queues`` are sorted names; ``last_seen`` is its latest heartbeat."""

    node_id: str
    host: str
    pid: int
    code_version: str | None
    workflows: tuple[str, ...]
    activities: tuple[str, ...]
    queues: tuple[str, ...]
    started_at: datetime
    last_seen: datetime


def engine_info(info: EngineInfo) -> EngineInfo:
    """``info`` if every text of it can be stored (no NUL, no lone surrogate), else the
    ValueError or TypeError naming the field: every store refuses the same rows, before any
    write. The engine refuses such names where they enter; this is the defence in depth."""
    validate_text(info.node_id, "node_id")
    validate_text(info.host, "host")
    validate_optional_text(info.code_version, "code_version")
    for field in ("workflows", "activities", "queues"):
        for name in getattr(info, field):
            validate_text(name, field)
    if isinstance(info.pid, bool) or not isinstance(info.pid, int) or not 0 <= info.pid <= 2**31 - 1:
        raise ValueError(f"pid must be an int from 0 to {2**31 - 1}, got {info.pid!r:.60}")
    return info


class EngineRegistry(Protocol):
    def heartbeat_engine(self, info: EngineInfo, now: datetime, expires_at: datetime) -> None:
        """Write the engine's row (``info.last_seen`` is ``now``), or, when it has one, only
        push its ``last_seen`` to ``now`` and its expiry to ``expires_at`` (its ``started_at``
        stays). In the same transaction, delete the rows expired before ``now``."""
        ...

    def remove_engine(self, node_id: str) -> None:
        """Delete the engine's row (a graceful stop); nothing for an unknown one."""
        ...

    def list_engines(self, now: datetime) -> list[EngineInfo]:
        """The engines whose row has not expired at ``now``, by ``node_id``."""
        ...
