"""Read models the engine returns: RunInfo."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo


@attrs.frozen(kw_only=True)
class RunInfo:
    """A snapshot of one run; ``result`` is decoded with the workflow's return type hint."""

    run_id: str
    workflow_name: str
    instance_id: str | None
    status: RunStatus
    custom_status: str | None
    priority: int
    concurrency_key: str | None
    labels: Mapping[str, str]
    parent_run_id: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    result: Any
    failure: FailureInfo | None
