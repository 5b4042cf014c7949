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
    """``wait_for_event``, ``wait_condition`` or ``first`` reached its timeout first."""


class WorkflowCancelledError(DexError):
    """``Engine.wait`` on a run that ended CANCELLED."""


class CancelledError(BaseException):
    """Raised at the await where workflow code stands when its run is cancelled (``engine.cancel``,
    a deadline) or when it awaits a step it cancelled (``step.cancel()``).

    A BaseException, so that ``except Exception`` does not swallow it: cleanup goes in ``finally``
    or ``except dex.CancelledError`` (docs/reference/contract.md §14). The run ends CANCELLED when
    it escapes the workflow function."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "cancelled")
        self.reason = reason


class UpdateRejectedError(_FailureCarrier):
    """``Engine.update``: the update's validator refused it, or the run has no handler of that
    name (``.failure`` says why). Nothing was recorded."""


class UpdateFailedError(_FailureCarrier):
    """``Engine.update``: the handler raised (``.failure`` says what); the run goes on."""


class QueryError(DexError):
    """``Engine.query``: no query handler of that name, or the handler raised, or it tried to
    start a step or change the run's state (queries are read-only and never recorded)."""
