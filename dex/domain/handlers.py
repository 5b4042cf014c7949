"""The handlers workflow code registers for the outside (docs/reference/contract.md §14): updates
(with their validators), queries and events, and the names and keys the outside uses for them.

Registration happens while the code runs, so it is replayed like everything else; the executor
(``dex.domain.replay``) keeps what is registered and calls it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dex.domain import events as ev
from dex.domain.definitions import Signature, validate_name, validate_text
from dex.domain.values import Payload

KEY_LIMIT = 256


def validate_handler_name(name: object, what: str) -> str:
    """An update, query or event handler name: storable text (NUL and lone surrogates are named
    as such) that matches the name pattern of docs/reference/contract.md §2."""
    return validate_name(validate_text(name, what), what)


def validate_key(key: object, what: str) -> str:
    """A published value's or a stream's key: non-empty storable text of at most 256 characters."""
    text = validate_text(key, what)
    if not text or len(text) > KEY_LIMIT:
        raise ValueError(f"{what} must be 1 to {KEY_LIMIT} characters long, got {len(text)}")
    return text


def update_request(update_id: object, name: object, args: tuple[Payload, ...]) -> ev.UpdateRequested:
    """The inbox message of ``engine.update``, its id and name checked where they enter (a NUL or
    a lone surrogate is refused naming the problem, before anything is written)."""
    return ev.UpdateRequested(
        update_id=validate_key(update_id, "update id"), name=validate_handler_name(name, "update name"), args=args
    )


class UpdateHandler:
    """What ``@ctx.on_update(name)`` returns: the handler, callable as before, and ``.validator``
    to register the function that refuses a request before anything is recorded."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn
        self.signature = Signature.of(fn)
        self.validate: Callable[..., Any] | None = None

    def validator(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``fn(*args)`` runs before the handler; raising rejects the update."""
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise TypeError(f"the validator of update {self.name!r} must be a plain (sync) function")
        self.validate = fn
        return fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def sync_handler(fn: object, what: str) -> Callable[..., Any]:
    """``fn`` if it is a plain function (queries and event handlers may not await)."""
    if not callable(fn) or inspect.iscoroutinefunction(fn):
        raise TypeError(f"{what} must be a plain (sync) function, got {fn!r}")
    return fn
