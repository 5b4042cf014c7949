"""Workers in any language (docs/reference/contract.md §13): activity tasks over HTTP and gRPC.

:class:`ActivityTaskService` is the one implementation; :func:`dex.remote.http_routes.activity_task_routes`
serves it over HTTP (the ``web`` extra) and :func:`dex.remote.grpc_server.serve_grpc` over gRPC (the
``grpc`` extra). Neither transport is imported here, so this package works without them.
"""

from dex.remote.errors import (
    InvalidRequestError,
    InvalidValueError,
    LeaseLostError,
    PollLimitError,
    RemoteCallError,
    TaskNotFoundError,
    UnavailableError,
)
from dex.remote.service import ActivityTaskService
from dex.remote.values import PolledTask, RemoteFailure

__all__ = [
    "ActivityTaskService",
    "InvalidRequestError",
    "InvalidValueError",
    "LeaseLostError",
    "PollLimitError",
    "PolledTask",
    "RemoteCallError",
    "RemoteFailure",
    "TaskNotFoundError",
    "UnavailableError",
]
