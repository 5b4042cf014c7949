"""The connection a transaction step gets on the in-memory adapter: the factory's, as a stand-in.

``InMemoryAdapter(transaction_connection=factory)`` lets workflows with ``@dex.transaction``
steps run under ``drain()`` in tests, on whatever DB-API connection the factory returns (SQLite's,
say). The adapter commits or rolls that connection back after the step, so the step must not:
:class:`HeldConnection` hands everything through to the factory's connection but ``commit()``,
``rollback()``, ``close()`` and ``with conn:``, which it refuses with a terminal error naming
the step, remembered even when the function swallows it (:func:`run_held`). It reads no
driver's private state, so any object the factory returns works. Statements that end the
transaction (``COMMIT`` as SQL) are not looked for here: that is the PostgreSQL adapter's,
which knows its driver.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dex.app.ports.store import StepFailed
from dex.domain.values import TerminalError

T = TypeVar("T")


class HeldConnection:
    """The factory's connection ``conn`` while the step named ``step`` holds it."""

    __slots__ = ("_conn", "_step", "misused")

    def __init__(self, conn: Any, step: str) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "misused", None)

    def _refuse(self, what: str) -> TerminalError:
        message = (
            f"transaction step {self._step!r} called conn.{what}: the step's transaction is dex's to commit"
            " or roll back (return to commit, raise to roll back)"
        )
        object.__setattr__(self, "misused", message)
        return TerminalError(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)

    def commit(self) -> None:
        raise self._refuse("commit()")

    def rollback(self) -> None:
        raise self._refuse("rollback()")

    def close(self) -> None:
        raise self._refuse("close()")

    def __enter__(self) -> HeldConnection:
        raise self._refuse("__enter__ (a with block on the connection commits or closes it)")

    def __exit__(self, *args: object) -> None:
        return None

    def __aenter__(self) -> HeldConnection:
        raise self._refuse("__aenter__ (an async with block on the connection commits or closes it)")

    def __repr__(self) -> str:
        return f"<the transaction connection of step {self._step!r}: {self._conn!r}>"


def _misuse(held: HeldConnection | None) -> None:
    if held is not None and held.misused is not None:  # swallowed by the function: a failure all the same
        raise StepFailed(TerminalError(held.misused))


def _held(conn: Any, step: str) -> HeldConnection | None:
    return None if conn is None else HeldConnection(conn, step)


def run_held(conn: Any, step: str, work: Callable[[Any], T]) -> T:
    """``work`` on the factory's ``conn`` (None without a factory: handed as it is) held by ``step``."""
    held = _held(conn, step)
    try:
        result = work(held)
    except StepFailed:
        _misuse(held)
        raise
    _misuse(held)
    return result


async def run_held_async(conn: Any, step: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """``await work`` on the factory's ``conn`` held by ``step``, as :func:`run_held`."""
    held = _held(conn, step)
    try:
        result = await work(held)
    except StepFailed:
        _misuse(held)
        raise
    _misuse(held)
    return result
