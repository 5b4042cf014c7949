"""What the pages do: the overview's figures, and the actions of the pages' forms (cancel,
suspend, resume, send an event, send an update, ask a query, fork; pause, resume and size a queue; pause, resume and
trigger a schedule), each the engine's own call. Blocking: the pages run these in a thread."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from dex.app.ports.store import MAX_QUEUE_CAPACITY
from dex.views.render import jsonable
from dex.web.charts import minute_chart
from dex.web.errors import ApiError, bad_request
from dex.web.inputs import form_number

PAGE_UPDATE_WAIT = 30  # seconds the run page waits for an update's answer
NOTE_ANSWER = 300  # characters of an answer the page's note shows


def overview(web: Any, now: datetime) -> dict[str, Any]:
    counts = web.insights.status_counts()
    return {
        "counts": counts,
        "chart": minute_chart(web.insights.per_minute(now)),
        "queues": web.engine.list_queues(),
        "failing": web.insights.failing(20),
    }


def perform(web: Any, path: str, params: dict[str, str], fields: dict[str, str]) -> tuple[str, str]:
    """Do the action a form posted to ``path``; return a note of what was done and the page to
    go back to."""
    action = params["action"]
    engine = web.engine
    if path.startswith("/runs/"):
        run_id = params["run_id"]
        back = f"/runs/{run_id}"
        if action == "cancel":
            engine.cancel(run_id, fields.get("reason", ""))
            return "cancel requested", back
        if action == "terminate":
            engine.terminate(run_id, fields.get("reason", ""))
            return "terminated", back
        if action == "suspend":
            engine.suspend(run_id)
            return "suspend requested", back
        if action == "resume":
            engine.resume(run_id)
            return "resume requested", back
        if action == "event":
            event_id = fields.get("event_id", "")
            engine.send_event(run_id, event_id, _json_field(fields.get("payload", "")))
            return f"event {event_id} sent", back
        if action in ("update", "query"):
            return _converse(engine, run_id, action, fields), back
        if action == "fork":
            web.record(run_id)
            new_id = engine.fork(run_id)
            return f"forked as {new_id}", f"/runs/{new_id}"
    elif path.startswith("/queues/"):
        name, kind = params["name"], params["kind"]
        if action == "pause":
            engine.pause_queue(name, kind)
            return f"queue {name} paused", "/queues"
        if action == "resume":
            engine.resume_queue(name, kind)
            return f"queue {name} resumed", "/queues"
        if action == "capacity":
            capacity = form_number(fields, "capacity", 1, MAX_QUEUE_CAPACITY)
            engine.set_queue_capacity(name, kind, capacity)
            return f"queue {name} capacity set to {capacity}", "/queues"
    elif path.startswith("/schedules/"):
        name = params["name"]
        if action == "pause":
            engine.pause_schedule(name, fields.get("note", ""))
            return f"schedule {name} paused", "/schedules"
        if action == "resume":
            engine.resume_schedule(name)
            return f"schedule {name} resumed", "/schedules"
        if action == "trigger":
            new_id = engine.trigger_schedule(name)
            return f"schedule {name} triggered: run {new_id}", "/schedules"
    raise ApiError(404, "NotFound", f"no action {action!r} here")


def _converse(engine: Any, run_id: str, action: str, fields: dict[str, str]) -> str:
    """An update or a query typed into the run page; the note shows its answer (shortened: it
    travels in the page's address). Errors are the engine's, shown as for any action."""
    name = fields.get("name", "")
    args = _json_field(fields.get("args", "")) or []
    if not isinstance(args, list):
        raise bad_request('arguments must be a JSON array, e.g. ["lamp", 2]')
    if action == "query":
        return f"query {name}: {_shown(engine.query(run_id, name, *args))}"
    try:
        result = engine.update(run_id, name, *args, timeout=PAGE_UPDATE_WAIT)
    except TimeoutError:
        return f"update {name} sent; no answer within {PAGE_UPDATE_WAIT} s (the run still answers it)"
    return f"update {name} answered: {_shown(result)}"


def _shown(value: Any) -> str:
    text = json.dumps(jsonable(value), ensure_ascii=False)
    return text if len(text) <= NOTE_ANSWER else text[: NOTE_ANSWER - 1] + "…"


def _json_field(text: str) -> Any:
    """A payload typed into a form: JSON, or empty for none."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise bad_request(f"payload must be JSON: {exc}") from None
