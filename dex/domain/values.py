"""Small value objects shared by events, commands and the engine: payloads and failures.

Also the two exceptions activity code raises to steer its retries (:class:`ApplicationError`,
:class:`TerminalError`): :meth:`FailureInfo.from_exception` reads them, and the errors dex
raises (``dex.domain.errors``) carry a :class:`FailureInfo`, so they sit below both.
"""

from __future__ import annotations

import traceback
from datetime import timedelta

import attrs


class ApplicationError(Exception):
    """Raised by activity code to control retries.

    ``terminal=True`` stops retrying at once; ``retry_after`` replaces the delay that the
    retry policy would compute for the next attempt.
    """

    def __init__(
        self,
        message: str = "",
        terminal: bool = False,
        retry_after: timedelta | float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.terminal = terminal
        if isinstance(retry_after, (int, float)):
            retry_after = timedelta(seconds=retry_after)
        self.retry_after: timedelta | None = retry_after


class TerminalError(ApplicationError):
    """An activity failure that must not be retried."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message, terminal=True)


@attrs.frozen(kw_only=True)
class Payload:
    """A serialised value: an encoding name, its bytes and, for protobuf, the message type.

    The domain never looks inside; a payload converter at the edge makes and reads them.
    """

    encoding: str
    data: bytes
    message_type: str = ""


def visible_text(text: str) -> str:
    """``text`` as it can be stored: a code point with no UTF-8 form (a lone surrogate, as in
    ``"\\ud800"``) becomes its visible escape, the six characters ``\\ud800``; everything else,
    NUL included (a failure is stored as protobuf bytes, never in a text column), is kept."""
    if not isinstance(text, str) or text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# the deepest chain of causes a failure records (a longer one, or a cycle, is cut short)
MAX_CAUSES = 32

# The longest failure text (a type, a message, a stack trace) a FailureInfo keeps, in characters.
# Payloads stop at 2 MiB, but an exception's message is user code's and had no bound: a 50 MB one
# made a 100 MB history and run page. A longer text keeps its start (where a message says what
# went wrong) and its end (a stack trace's innermost frames), with a visible note between them.
MAX_FAILURE_TEXT = 40_000
FAILURE_TEXT_HEAD = 32_768
FAILURE_TEXT_TAIL = 4_096


def failure_text(text: str) -> str:
    """``text`` as a failure keeps it: storable (:func:`visible_text`) and at most
    :data:`MAX_FAILURE_TEXT` characters. A longer one keeps its first :data:`FAILURE_TEXT_HEAD`
    and last :data:`FAILURE_TEXT_TAIL` characters around a note saying how long it was, e.g.
    ``… [truncated: 52,428,800 characters, kept the first 32,768 and last 4,096] …``. A text
    that is already so is kept as it is, so a failure read back from the store is unchanged."""
    if not isinstance(text, str):
        return text
    if len(text) <= MAX_FAILURE_TEXT:
        text = visible_text(text)
        if len(text) <= MAX_FAILURE_TEXT:
            return text
    # only the kept ends are made visible: a huge text is never escaped (or copied) whole
    head = visible_text(text[:FAILURE_TEXT_HEAD])[:FAILURE_TEXT_HEAD]
    tail = visible_text(text[-FAILURE_TEXT_TAIL:])[-FAILURE_TEXT_TAIL:]
    note = f"[truncated: {len(text):,} characters, kept the first {FAILURE_TEXT_HEAD:,} and last {FAILURE_TEXT_TAIL:,}]"
    return f"{head}\n… {note} …\n{tail}"


@attrs.frozen(kw_only=True)
class FailureInfo:
    """What went wrong: exception type, message, stack, whether retrying is pointless, cause.

    Its texts are always storable and bounded (:func:`failure_text`): an exception message with
    a lone surrogate cannot hold up the batch of writes that records it, and a 50 MB one is kept
    as its first and last few thousand characters, saying so. Every failure is made through this
    constructor (from an exception, from a remote worker's ``fail``, read back from the store), so
    none escapes the bound.
    """

    type: str = attrs.field(converter=failure_text)
    message: str = attrs.field(converter=failure_text)
    stack_trace: str = attrs.field(default="", converter=failure_text)
    terminal: bool = False
    cause: FailureInfo | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, *, terminal: bool | None = None) -> FailureInfo:
        """Describe ``exc`` (and its ``__cause__`` chain) as a failure. Never raises.

        User code's exceptions may be hostile: a ``__str__`` that raises, a ``terminal`` or
        ``failure`` property that raises, a cycle of causes. What cannot be read becomes a
        placeholder naming the exception's type, so the failure is still recorded.
        """
        chain = [exc]
        seen = {id(exc)}
        while len(chain) <= MAX_CAUSES:
            cause_exc = _attribute(chain[-1], "__cause__")
            if not isinstance(cause_exc, BaseException) or id(cause_exc) in seen:
                break
            seen.add(id(cause_exc))
            chain.append(cause_exc)
        # the innermost cause first: each exception's failure is built on its cause's
        innermost = chain[-1]
        carried = _attribute(innermost, "failure") if _attribute(innermost, "__cause__") is None else None
        cause = carried if isinstance(carried, FailureInfo) else None
        for position in range(len(chain) - 1, -1, -1):
            current = chain[position]
            if position == 0 and terminal is not None:
                is_terminal = terminal
            elif position == 0:
                is_terminal = isinstance(current, ApplicationError) and _truthy(_attribute(current, "terminal"))
            else:
                is_terminal = False
            cause = cls(
                type=_type_name(current),
                message=_message(current),
                stack_trace=_stack_trace(current),
                terminal=is_terminal,
                cause=cause,
            )
        assert cause is not None
        return cause


def _attribute(exc: BaseException, name: str) -> object:
    try:
        return getattr(exc, name, None)
    except BaseException:  # noqa: BLE001 - a property of user code that raises reads as absent
        return None


def _truthy(value: object) -> bool:
    try:
        return bool(value)
    except BaseException:  # noqa: BLE001 - a __bool__ that raises: not terminal, the policy decides
        return False


def _type_name(exc: BaseException) -> str:
    name = type(exc).__name__
    return name if isinstance(name, str) else "<unnamed exception type>"


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException as error:  # noqa: BLE001 - the failure must be recorded all the same
        return f"<unprintable {_type_name(exc)}: __str__ raised {_type_name(error)}>"
    return text


def _stack_trace(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    except BaseException as error:  # noqa: BLE001 - fall back to the frames alone
        try:
            frames = "".join(traceback.format_tb(exc.__traceback__))
        except BaseException:  # noqa: BLE001
            frames = ""
        return f"{frames}<{_type_name(exc)}: its traceback could not be formatted ({_type_name(error)})>"


def describe_failure(failure: FailureInfo) -> str:
    """A one-line text of a failure and its causes, for error messages."""
    text = f"{failure.type}: {failure.message}"
    if failure.cause is not None:
        text += f" (caused by {describe_failure(failure.cause)})"
    return text
