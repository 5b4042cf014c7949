"""Runs for the API and the pages: filters read from a request, pages by keyset, runs as JSON.

Everything here reads through the store's ports (``list_runs``, ``get_run``,
``load_history``), so the dashboard shows the memory adapter and PostgreSQL alike, and every
query is one the engine already makes: the newest runs first, by the index on
``(created_at, position)`` (see :mod:`dex.web.inputs` for the cursor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dex.app.facade.reads import run_filter
from dex.app.ports.store import RunFilter, RunRecord, Store
from dex.domain import events as ev
from dex.domain.context import fire_time
from dex.domain.status import RunStatus
from dex.views.render import jsonable, run_json
from dex.web import inputs
from dex.web.errors import bad_request
from dex.web.inputs import Cursor
from dex.web.signing import Signer

STATUSES = tuple(status.value for status in RunStatus)
LEVELS = ("top", "all")  # the runs list's `level`: top-level runs (the default), or runs at any level


@attrs.frozen(kw_only=True)
class RunQuery:
    """A runs list request: the filters of ``list_runs``, a page size and where the page starts."""

    filter: RunFilter
    limit: int
    cursor: Cursor | None = None


def run_query(params: Any, signer: Signer, default_limit: int = 50) -> RunQuery:
    """The runs list request a query string makes (``workflow``, ``status`` (repeatable),
    ``label=KEY=VALUE`` (repeatable), ``instance_id``, ``code_version``, ``created_after``,
    ``created_before``, ``parent_run_id``, ``level``, ``limit``, ``cursor``, its signature
    checked by ``signer``).

    Children are listed under their parents: without ``parent_run_id`` only top-level runs
    (no run's child) are listed unless ``level`` is ``all``; with it, that run's children."""
    statuses = [inputs.checked(s, "status").upper() for s in params.getlist("status") if s]
    for status in statuses:
        if status not in STATUSES:
            raise bad_request(f"status must be one of {', '.join(STATUSES)}, got {status[:40]!r}")
    limit = inputs.integer(params, "limit", default_limit, 1, inputs.MAX_PAGE)
    try:
        base = run_filter(
            inputs.one(params, "workflow") or inputs.one(params, "workflow_name"),
            statuses or None,
            inputs.labels(params.getlist("label")),
            inputs.one(params, "instance_id"),
            inputs.moment(params, "created_after"),
            inputs.moment(params, "created_before"),
            limit,
            inputs.one(params, "code_version"),
        )
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc)) from None
    parent = inputs.one(params, "parent_run_id")
    level = inputs.one(params, "level") or "top"
    if level not in LEVELS:
        raise bad_request(f"level must be top or all, got {level[:40]!r}")
    base = attrs.evolve(base, parent_run_id=parent, top_level=parent is None and level == "top")
    cursor_text = inputs.one(params, "cursor")
    return RunQuery(filter=base, limit=limit, cursor=Cursor.decode(cursor_text, signer) if cursor_text else None)


def page_of_runs(store: Store, query: RunQuery) -> tuple[list[RunRecord], Cursor | None]:
    """One page of runs, newest first, and the cursor of the next page (None on the last)."""
    cursor = query.cursor
    skip = 0
    base = query.filter
    if cursor is not None:
        before = cursor.bound()
        if base.created_before is not None and base.created_before < before:
            before = base.created_before
        skip = cursor.shown_at_instant
        base = attrs.evolve(base, created_before=before)
    rows = store.list_runs(attrs.evolve(base, limit=skip + query.limit + 1))
    # the runs at the cursor's instant come first (nothing newer is asked for): skip those shown
    start = 0
    while cursor is not None and start < min(skip, len(rows)) and rows[start].created_at == cursor.created_at:
        start += 1
    page = rows[start : start + query.limit]
    if len(rows) <= start + query.limit or not page:
        return page, None
    last = page[-1].created_at
    at_instant = sum(1 for row in page if row.created_at == last)
    if cursor is not None and last == cursor.created_at:
        at_instant += start
    return page, Cursor(created_at=last, shown_at_instant=at_instant)


def run_document(record: RunRecord) -> dict[str, Any]:
    """A run as the API shows it: the fields of ``RunInfo`` (results decoded without the
    workflow's type hints, as JSON), plus its queue."""
    document = run_json(record)
    scheduled = fire_time(record.labels, record.instance_id)
    document["scheduled_at"] = jsonable(scheduled)
    return document


def event_document(item: ev.HistoryEvent) -> dict[str, Any]:
    """A history event as JSON: its number, time, kind and fields, payloads decoded."""
    return {
        "sequence_number": item.sequence_number,
        "timestamp": jsonable(item.timestamp),
        "kind": item.kind,
        "event": jsonable(item.event),
    }


def children_of(history: Sequence[ev.HistoryEvent]) -> list[str]:
    """The run ids of the children a history started, in order."""
    return [item.event.child_run_id for item in history if isinstance(item.event, ev.ChildRunCreated)]


def created_event(history: Sequence[ev.HistoryEvent]) -> ev.RunCreated | None:
    return next((item.event for item in history if isinstance(item.event, ev.RunCreated)), None)


def query_string(params: Mapping[str, Any]) -> str:
    """A query string for the pages' links (the next page keeps the filters)."""
    from urllib.parse import urlencode

    pairs: list[tuple[str, Any]] = []
    for key, value in params.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        pairs.extend((key, v) for v in values if v not in (None, ""))
    return urlencode(pairs)
