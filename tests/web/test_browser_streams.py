"""The run page follows a run's published values and streams live, in a real browser
(docs/reference/contract.md §14): headless Chromium as in tests/web/test_browser.py, whose
browser and server it uses. A hostile value is shown as text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.web import create_app
from tests.web.test_browser import CHROMIUM, DRIVER, HOSTILE, browser, console_errors, serve, wait_for

__all__ = ["browser"]  # the fixture, shared with tests/web/test_browser.py

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no Chromium and chromedriver installed (apt-get install chromium chromium-driver; scripts/test.sh does it)",
)


@dex.workflow(name="web-live-stream")
async def live_stream(ctx: dex.WorkflowContext) -> None:
    ctx.publish("stage", "packing")
    ctx.publish("note", HOSTILE)
    await ctx.write_stream("progress", {"step": "picked"})
    await ctx.wait_for_event("more")
    await ctx.write_stream("progress", {"step": HOSTILE})
    ctx.publish("stage", "shipped")
    ctx.close_stream("progress")
    await ctx.wait_for_event("done")


@pytest.fixture(scope="module")
def served_streams() -> Iterator[tuple[str, dex.Engine]]:
    engine = dex.Engine(InMemoryAdapter(), workflows=[live_stream], poll_interval=0.01)
    engine.start()
    try:
        with serve(create_app(engine)) as base:
            yield base, engine
    finally:
        engine.stop(timeout=5)


def test_the_run_page_shows_published_values_and_streams_live(
    served_streams: tuple[str, dex.Engine], browser: Any
) -> None:
    base, engine = served_streams
    run_id = engine.start_workflow(live_stream)
    assert engine.get_published(run_id, "note", timeout=10) == HOSTILE
    browser.get(f"{base}/runs/{run_id}")
    published = browser.find_element("id", "published")
    assert "packing" in published.text and HOSTILE in published.text  # as text, not markup
    assert browser.title.startswith("web-live-stream")  # the hostile script did not run
    items = browser.find_elements("css selector", ".stream-items li")
    assert len(items) == 1 and "picked" in items[0].text
    engine.send_event(run_id, "more")  # the page is not reloaded: its events bring the rest
    assert wait_for(lambda: len(browser.find_elements("css selector", ".stream-items li")) == 2)
    assert HOSTILE in browser.find_elements("css selector", ".stream-items li")[1].text
    assert wait_for(lambda: "shipped" in browser.find_element("id", "published").text)
    assert wait_for(lambda: browser.find_element("css selector", ".stream-state").text == "closed")
    assert browser.find_element("css selector", ".stream-length").text == "2"
    assert console_errors(browser) == []
    engine.send_event(run_id, "done")
    engine.wait(run_id, timeout=10)
