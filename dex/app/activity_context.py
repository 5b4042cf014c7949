"""``dex.activity_context()``: what a running activity may know about itself."""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import attrs


@attrs.frozen(kw_only=True)
class ActivityContext:
    """The run and attempt an activity executes for; ``heartbeat()`` extends its lease."""

    run_id: str
    activity_name: str
    attempt: int
    _heartbeat: Callable[[], bool] = attrs.field(alias="heartbeat_fn", repr=False)

    def heartbeat(self) -> bool:
        """Extend this attempt's lease by its lock timeout; False when the lease is already lost."""
        return self._heartbeat()


_current: contextvars.ContextVar[ActivityContext | None] = contextvars.ContextVar("dex_activity", default=None)


def activity_context() -> ActivityContext:
    """The context of the activity running in this thread or task."""
    context = _current.get()
    if context is None:
        raise RuntimeError("dex.activity_context() is only available inside a running activity")
    return context


def set_activity_context(context: ActivityContext | None) -> contextvars.Token[ActivityContext | None]:
    return _current.set(context)


def reset_activity_context(token: contextvars.Token[ActivityContext | None]) -> None:
    _current.reset(token)
