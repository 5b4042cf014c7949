"""How the web app reports errors: one JSON shape, ``{"error": {"type", "message"}}``, and the
status code that fits the error (docs/reference/contract.md §12).

An error dex itself raises for a request is the caller's answer: no such run (404), an
illegal transition (409), a value dex refuses (422). A request the app cannot even read (bad
JSON, a query parameter of the wrong form) is a 400. Anything else comes from the machinery
(the database went away mid-request): a 503 for the store's known outages, a 500 otherwise,
with the exception's type and first line but never its traceback, and logged here, so one
failing request is one failing request and the next one is served as usual.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.responses import JSONResponse

from dex.domain.errors import (
    DexError,
    InvalidStateError,
    NotFoundError,
    NotRegisteredError,
    SerializationError,
)
from dex.web.body_limit import BodyTooLarge

log = logging.getLogger("dex.web")


class ApiError(Exception):
    """An error the app answers with ``status`` and ``{"error": {"type": kind, "message"}}``."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def first_line(exc: BaseException) -> str:
    """The exception's message on one line; an exception that cannot be printed still has a type."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not turn one error into another
        return type(exc).__name__
    text = text.strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line.encode("utf-8", "backslashreplace").decode("utf-8")[:500]


# what ends a process or a task, not a request: never answered, always raised on (and a body
# that passed its limit, whose request the body limit has answered already)
PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError, BodyTooLarge)


def classify(exc: BaseException) -> ApiError:
    """The status code and type that answer ``exc`` (a ``BaseException`` of the store's too:
    one odd exception fails its own request, not the server; see ``PASS_THROUGH``)."""
    if isinstance(exc, PASS_THROUGH):
        raise exc
    if isinstance(exc, ApiError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, NotFoundError):
        return ApiError(404, name, first_line(exc))
    if isinstance(exc, NotRegisteredError):
        return ApiError(422, name, first_line(exc))
    if isinstance(exc, InvalidStateError):
        return ApiError(409, name, first_line(exc))
    if isinstance(exc, (SerializationError, ValueError, TypeError, OverflowError)):
        return ApiError(422, name, first_line(exc))
    if isinstance(exc, DexError):
        return ApiError(409, name, first_line(exc))
    if _is_outage(exc):
        log.warning("request failed: the store is unavailable (%s: %s)", name, first_line(exc))
        return ApiError(503, "StoreUnavailable", f"the store is unavailable: {name}: {first_line(exc)}")
    log.error("request failed with %s: %s", name, first_line(exc), exc_info=exc)
    return ApiError(500, "InternalError", f"{name}: {first_line(exc)}")


def _is_outage(exc: BaseException) -> bool:
    """A connection lost or a pool exhausted: the store's outage, a 503 the client may retry."""
    try:
        import psycopg
        from psycopg_pool import PoolTimeout
    except ImportError:  # pragma: no cover - psycopg is a core dependency
        return False
    from dex.adapters.postgres import DatabaseConnectionError

    return isinstance(exc, (psycopg.OperationalError, PoolTimeout, DatabaseConnectionError, ConnectionError))


def error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error_body(error.kind, error.message), status_code=error.status, headers=headers)
