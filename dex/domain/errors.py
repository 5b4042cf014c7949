"""The exceptions dex raises, all under :class:`DexError`.

The two that activity code raises to steer its retries, :class:`ApplicationError` and
:class:`TerminalError`, live beside :class:`FailureInfo` in ``dex.domain.values``, which reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dex.domain.values import FailureInfo


class DexError(Exception):
    """Base class of every error dex raises."""


class SerializationError(DexError, TypeError):
    """A value cannot be turned into a payload, or a payload back into the expected type."""


class NotRegisteredError(DexError, LookupError):
    """A workflow or activity name is not registered with this engine."""


class NotFoundError(DexError, LookupError):
    """No run, schedule or other named thing has the given id or name."""


class RunNotFoundError(NotFoundError):
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
