"""Small value objects shared by events, commands and the engine: payloads and failures."""

from __future__ import annotations

import traceback

import attrs

from dex.domain.errors import ApplicationError


@attrs.frozen(kw_only=True)
class Payload:
    """A serialised value: an encoding name, its bytes and, for protobuf, the message type.

    The domain never looks inside; a payload converter at the edge makes and reads them.
    """

    encoding: str
    data: bytes
    message_type: str = ""


@attrs.frozen(kw_only=True)
class FailureInfo:
    """What went wrong: exception type, message, stack, whether retrying is pointless, cause."""

    type: str
    message: str
    stack_trace: str = ""
    terminal: bool = False
    cause: FailureInfo | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, *, terminal: bool | None = None) -> FailureInfo:
        """Describe ``exc`` (and its ``__cause__`` chain) as a failure."""
        if terminal is None:
            terminal = isinstance(exc, ApplicationError) and exc.terminal
        cause_exc = exc.__cause__
        carried = getattr(exc, "failure", None)
        cause: FailureInfo | None
        if cause_exc is not None:
            cause = cls.from_exception(cause_exc, terminal=False)
        elif isinstance(carried, FailureInfo):
            cause = carried
        else:
            cause = None
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            stack_trace="".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)),
            terminal=terminal,
            cause=cause,
        )


def describe_failure(failure: FailureInfo) -> str:
    """A one-line text of a failure and its causes, for error messages."""
    text = f"{failure.type}: {failure.message}"
    if failure.cause is not None:
        text += f" (caused by {describe_failure(failure.cause)})"
    return text
