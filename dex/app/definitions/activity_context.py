"""``dex.activity_context()``: what a running activity may know about itself."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

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
    _write_stream: Callable[[str, Any], None] | None = attrs.field(alias="write_stream_fn", repr=False, default=None)

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

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to the run's stream ``key`` (docs/reference/contract.md §14), at once: readers
        see it while the activity goes on. At least once, like the activity: an attempt that is
        retried writes its items again. ``ValueError`` for a bad key or a closed stream,
        ``InvalidStateError`` once the run has ended, ``SerializationError`` for a value the
        payload converter cannot encode; a store that fails raises its error (the attempt may
        catch it, or fail and be retried)."""
        if self._write_stream is None:
            raise RuntimeError(f"activity {self.activity_name!r} cannot write to streams here (a transaction step)")
        self._write_stream(key, value)


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
