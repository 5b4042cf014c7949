"""Serving until Ctrl-C: how ``dex web`` and ``dex dev`` stop (exit code 0, not 130).

Stopping is how a server started from a terminal is meant to end, so SIGINT and SIGTERM set an
event instead of raising ``KeyboardInterrupt``. uvicorn installs its own handlers once it runs
(it shuts down gracefully and raises the signal again, which ours then takes); a signal that
arrives before, while it starts, is ours, and :func:`stop_when_set` passes it on to the server.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def until_signalled() -> Iterator[threading.Event]:
    """An event SIGINT and SIGTERM set while inside (instead of KeyboardInterrupt and exit 130)."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_when_set(stop: threading.Event, server: Any, name: str) -> None:
    """Ask the uvicorn ``server`` to shut down once ``stop`` is set (from a daemon thread)."""

    def wait_then_stop() -> None:
        stop.wait()
        server.should_exit = True  # uvicorn's own way to ask a running server to shut down

    threading.Thread(target=wait_then_stop, name=name, daemon=True).start()
