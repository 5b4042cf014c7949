"""The run page's published values and streams (docs/reference/contract.md §14): the latest value
of each key and the newest items of each stream, read from the store's tables (never the
history), with the ``/v1`` event-stream URLs the page's script follows to show them live."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dex.views.render import jsonable_payload
from dex.web.run_view import pretty

SHOWN_ITEMS = 20  # the newest items of a stream the page shows (the live ones are added to them)


def published_view(store: Any, run_id: str, root: str) -> dict[str, Any]:
    """``published``: per key its value pretty-printed and its event URL; ``streams``: per stream
    its length, whether it is closed, its newest items (position, text) and its event URL (after
    the last item shown)."""
    summary = store.run_streams(run_id)
    base = f"{root}/v1/runs/{quote(run_id, safe='')}"
    published = [
        {"key": key, "text": pretty(jsonable_payload(value)), "url": f"{base}/published/{quote(key, safe='')}"}
        for key, value in summary.published
    ]
    streams = []
    for stream in summary.streams:
        after = max(0, stream.length - SHOWN_ITEMS)
        page = store.read_stream(run_id, stream.key, after, SHOWN_ITEMS)
        items = [(position, pretty(jsonable_payload(value))) for position, value in page.items]
        last = items[-1][0] if items else after
        streams.append(
            {
                "key": stream.key,
                "length": stream.length,
                "closed": stream.closed,
                "items": items,
                "url": f"{base}/streams/{quote(stream.key, safe='')}?after={last}",
            }
        )
    return {"published": published, "streams": streams}
