"""What a run published and streamed (docs/reference/contract.md §14), as text and as JSON: the
``published`` and ``streams`` parts of ``dex runs show`` and of the dashboard's run page."""

from __future__ import annotations

from typing import Any

from dex.app.ports.streams import RunStreams
from dex.views.render import jsonable_payload, shorten, show_payload, table


def published_text(streams: RunStreams) -> str:
    """The latest value of each published key, then each stream with its length, as tables;
    empty when the run published and streamed nothing."""
    parts = []
    if streams.published:
        rows = table(("KEY", "VALUE"), ((shorten(key, 40), show_payload(value)) for key, value in streams.published))
        parts.append(f"published values: {len(streams.published)}\n{rows}")
    if streams.streams:
        rows = table(
            ("STREAM", "ITEMS", "STATE"),
            ((shorten(s.key, 40), str(s.length), "closed" if s.closed else "open") for s in streams.streams),
        )
        parts.append(f"streams: {len(streams.streams)}\n{rows}")
    return "\n\n".join(parts)


def published_json(streams: RunStreams) -> dict[str, Any]:
    """``published`` (key -> the latest value as JSON) and ``streams`` (key, length, closed)."""
    return {
        "published": {key: jsonable_payload(value) for key, value in streams.published},
        "streams": [{"key": s.key, "length": s.length, "closed": s.closed} for s in streams.streams],
    }
