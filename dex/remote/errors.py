"""The errors of the remote-worker API (docs/reference/contract.md §13), each with the HTTP status it answers with.

The service raises them; the HTTP routes turn one into ``{"error": {"type", "message"}}`` with
its ``status``, and the gRPC server into the matching status code. Nothing changed in the store
when a call ends with one of them.
"""

from __future__ import annotations


class RemoteCallError(Exception):
    """A call of a remote worker that was refused; ``status`` is its HTTP status."""

    status = 400
    kind = "BadRequest"
    retry_after: int | None = None  # seconds: the call may be made again after them (HTTP Retry-After)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(RemoteCallError):
    """The request is malformed: not a JSON object, a field missing or of the wrong type.

    Its type is ``BadRequest``, the word the rest of the JSON API (``/v1``) answers a request it
    cannot read with, so a client of both tells a malformed request by one type."""

    status, kind = 400, "BadRequest"


class BodyTooLargeError(RemoteCallError):
    """The request body is larger than the routes take (as the dashboard's app answers it)."""

    status, kind = 413, "PayloadTooLarge"


class TaskNotFoundError(RemoteCallError):
    """The path names no task: its id is not a task id at all."""

    status, kind = 404, "NotFound"


class LeaseLostError(RemoteCallError):
    """The task is not held under the lease the call names: it expired, another worker took it
    over, it was completed or failed already, or its run ended."""

    status, kind = 409, "LeaseLost"


class InvalidValueError(RemoteCallError):
    """A well-formed request with a value dex cannot take (a NUL or lone surrogate in a name, a
    result with no JSON form, a number out of range)."""

    status, kind = 422, "InvalidValue"


class UnavailableError(RemoteCallError):
    """The store could not be reached, or failed; the call may be made again."""

    status, kind = 503, "Unavailable"


class PollLimitError(UnavailableError):
    """A poll that would wait while the most long polls the server keeps are open; poll again
    after ``retry_after`` seconds. It claimed nothing."""

    retry_after = 1
