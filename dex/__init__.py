"""dex: an embedded durable execution engine for Python on PostgreSQL.

Workflows are ``async def`` functions whose every step is recorded as an event; after a crash
any process replays the history and carries on. Activities do the I/O and are retried under
a policy. See README.md for a tour and docs/reference/contract.md for the contract.
"""

from dex.app.definitions.activity_context import ActivityContext, activity_context
from dex.app.definitions.registry import activity, workflow
from dex.app.definitions.transactions import transaction
from dex.app.facade.engine import Engine
from dex.app.facade.info import RunInfo
from dex.app.facade.steps import ActivityStep
from dex.app.ports.engines import EngineInfo
from dex.app.ports.store import FailedAttempt, QueueInfo
from dex.app.runtime.health import EngineHealth
from dex.app.schedules.spec import Schedule, ScheduleInfo
from dex.domain.context import WorkflowContext
from dex.domain.errors import (
    ActivityFailedError,
    CancelledError,
    ChildWorkflowFailedError,
    DexError,
    InvalidStateError,
    NonDeterminismError,
    NotFoundError,
    NotRegisteredError,
    QueryError,
    RunNotFoundError,
    SerializationError,
    UpdateFailedError,
    UpdateRejectedError,
    WaitTimeoutError,
    WorkflowCancelledError,
    WorkflowFailedError,
)
from dex.domain.events import HistoryEvent
from dex.domain.queue_limits import RateLimit
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import ApplicationError, FailureInfo, TerminalError
from dex.serialization.payloads import PayloadConverter

__all__ = [
    "ActivityContext",
    "ActivityFailedError",
    "ActivityStep",
    "ApplicationError",
    "CancelledError",
    "ChildWorkflowFailedError",
    "DexError",
    "Engine",
    "EngineHealth",
    "EngineInfo",
    "FailedAttempt",
    "FailureInfo",
    "HistoryEvent",
    "InvalidStateError",
    "NonDeterminismError",
    "NotFoundError",
    "NotRegisteredError",
    "PayloadConverter",
    "QueryError",
    "QueueInfo",
    "RateLimit",
    "RetryPolicy",
    "RunInfo",
    "RunNotFoundError",
    "RunStatus",
    "Schedule",
    "ScheduleInfo",
    "SerializationError",
    "TerminalError",
    "UpdateFailedError",
    "UpdateRejectedError",
    "WaitTimeoutError",
    "WorkflowCancelledError",
    "WorkflowContext",
    "WorkflowFailedError",
    "activity",
    "activity_context",
    "testing",
    "transaction",
    "workflow",
]

import logging as _logging

# quiet by default: applications decide where dex's records go (loggers "dex.*")
_logging.getLogger("dex").addHandler(_logging.NullHandler())

from dex import testing  # noqa: E402  (dex.testing.replay etc. without a separate import)
