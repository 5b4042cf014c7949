"""The run page's content: the run, its input and outcome pretty-printed, parent and children,
its steps as a timeline, its pending activities and its full history with decoded payloads."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.views.render import decode, jsonable, show_payload
from dex.views.timeline import stack_trace
from dex.web.charts import steps_of, timeline
from dex.web.listing import children_of, created_event, event_document


def pretty(value: Any) -> str:
    """JSON data, indented for reading."""
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False, default=repr)


def pretty_payload(payload: Payload | None) -> str:
    if payload is None:
        return "null"
    try:
        return pretty(jsonable(decode(payload)))
    except SerializationError:
        return show_payload(payload, limit=None)


def run_view(web: Any, run_id: str, now: datetime) -> dict[str, Any]:
    run = web.record(run_id)
    history = web.store.load_history(run_id)
    pending = web.insights.pending_activities(run_id, history) if not run.status.is_terminal else []
    created = created_event(history)
    steps = steps_of(history, pending)
    end = run.completed_at or now
    return {
        "run": run,
        "title": f"{run.workflow_name} {run.run_id}",
        "inputs": [pretty_payload(p) for p in created.input] if created is not None else [],
        "result": pretty_payload(run.result) if run.result is not None else None,
        "failure": run.failure,
        "failure_trace": stack_trace(run.failure) if run.failure is not None else None,
        "task_failure": run.task_failure,
        "task_failure_trace": stack_trace(run.task_failure) if run.task_failure is not None else None,
        "children": children_of(history),
        "timeline": timeline(steps, run.created_at, end),
        "pending": pending,
        "history": [{**event_document(item), "text": pretty(event_document(item)["event"])} for item in history],
        "live": not run.status.is_terminal,
    }
