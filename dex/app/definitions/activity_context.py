"""``dex.activity_context()``: what a running activity may know about itself."""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import attrs


@attrs.frozen(kw_only=True)
class ActivityContext:
    """The run and attempt an activity executes for; ``heartbeat()`` says it is alive, and
    ``cancel_requested`` whether it should stop."""

    run_id: str
    activity_name: str
    attempt: int
    _heartbeat: Callable[[], bool] = attrs.field(alias="heartbeat_fn", repr=False)
    _cancelled: Callable[[], bool] = attrs.field(alias="cancelled_fn", repr=False, default=lambda: False)

    @property
    def cancel_requested(self) -> bool:
        """True once the run was cancelled or ended, or the attempt's lease is lost (docs/reference/contract.md §13):
        nothing the attempt returns from then on is recorded, so it may as well stop. An
        attempt run inline by its workflow task holds no lease, and is never told."""
        return self._cancelled()

    def heartbeat(self) -> bool:
        """Say the attempt is alive: its ``lock_timeout`` counts from now again, and its lease
        is extended (by the engine's short activity lease). False once the lease is lost
        (another worker took the task over), given up (the attempt ran past its
        ``lock_timeout``), or the run was cancelled or ended: what the attempt returns will not
        be recorded."""
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
