"""The exceptions users see, all under :class:`DexError`, plus the two that user code raises."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dex.domain.values import FailureInfo


class DexError(Exception):
    """Base class of every error dex raises."""


class SerializationError(DexError, TypeError):
    """A value cannot be turned into a payload, or a payload back into the expected type."""


class NotRegisteredError(DexError, LookupError):
    """A workflow or activity name is not registered with this engine."""


class RunNotFoundError(DexError, LookupError):
    """No run has the given id."""


class InvalidStateError(DexError):
    """The requested transition is not allowed from the run's current status."""


class NonDeterminismError(DexError):
    """Replayed workflow code asked for a different step than the history recorded."""


class _FailureCarrier(DexError):
    """An error that carries the :class:`FailureInfo` describing what failed."""

    def __init__(self, message: str, failure: FailureInfo) -> None:
        super().__init__(message)
        self.failure = failure


class ActivityFailedError(_FailureCarrier):
    """An activity failed terminally or ran out of attempts (``.failure`` says why)."""


class ChildWorkflowFailedError(_FailureCarrier):
    """A child workflow failed or was cancelled (``.failure`` says why)."""


class WorkflowFailedError(_FailureCarrier):
    """``Engine.wait`` on a run that ended FAILED (``.failure`` says why)."""


class WaitTimeoutError(DexError):
    """``wait_for_event`` reached its timeout before the event arrived."""


class WorkflowCancelledError(DexError):
    """``Engine.wait`` on a run that ended CANCELLED."""


class ApplicationError(Exception):
    """Raised by activity code to control retries.

    ``terminal=True`` stops retrying at once; ``retry_after`` replaces the delay that the
    retry policy would compute for the next attempt.
    """

    def __init__(
        self,
        message: str = "",
        *,
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
