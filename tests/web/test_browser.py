"""The dashboard in a real browser (docs/reference/contract.md §12): headless Chromium from the distribution's
packages, driven by selenium through the system's chromedriver. The pages load without
console errors, the runs table shows runs, filters work, cancel from the run page cancels,
and a hostile label is shown as text. ``DEX_UPDATE_SCREENSHOT=1`` also writes the README's
screenshot (docs/images/dashboard.png).

Skipped, saying why, only where no Chromium (or no chromedriver) is installed;
``scripts/test.sh`` installs both where apt-get can.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock
from dex.web import create_app
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, failing, waiting

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no Chromium and chromedriver installed (apt-get install chromium chromium-driver; scripts/test.sh does it)",
)
HOSTILE = "<script>document.title='owned'</script>"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port, in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: server.started), "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, dex.Engine]]:
    """A started engine over the memory adapter, and the app over it."""
    engine = dex.Engine(InMemoryAdapter(), workflows=WORKFLOWS, activities=ACTIVITIES, poll_interval=0.01)
    engine.start()
    try:
        with serve(create_app(engine)) as base:
            yield base, engine
    finally:
        engine.stop(timeout=5)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(condition: Any, timeout: float = 10) -> Any:
    """``condition()`` once it is true, or its last value at the deadline. An element of the page
    being left (a form's submit navigates) goes stale meanwhile: that is "not yet", not a failure
    (chromedriver says so as a stale reference, or, caught mid-navigation, as a node that "does
    not belong to the document")."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except WebDriverException as exc:  # (the stale and not-found errors are its subclasses)
            leaving = isinstance(exc, (StaleElementReferenceException, NoSuchElementException)) or (
                "does not belong to the document" in str(exc.msg)
            )
            if not leaving or time.monotonic() > deadline:
                raise
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_the_pages_load_without_console_errors(served: tuple[str, dex.Engine], browser: Any) -> None:
    base, engine = served
    run_id = engine.start_workflow(checkout, 12)
    engine.start_workflow(failing)
    engine.wait(run_id, timeout=10)
    browser.get_log("browser")  # start from a clean log
    for path in ("/", "/runs", f"/runs/{run_id}", "/queues", "/schedules"):
        browser.get(base + path)
        assert browser.find_element("css selector", "main h1").text, path
        assert console_errors(browser) == [], path


def test_the_runs_table_shows_runs_and_the_filters_work(served: tuple[str, dex.Engine], browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    base, engine = served
    done = engine.start_workflow(checkout, 1, labels={"team": "browser"})
    engine.wait(done, timeout=10)
    live = engine.start_workflow(waiting, labels={"team": "browser"})
    browser.get(base + "/runs")
    table = browser.find_element("id", "runs-table")
    assert done in table.text and live in table.text
    Select(browser.find_element("name", "status")).select_by_value("COMPLETED")
    browser.find_element("name", "label").send_keys("team=browser")
    browser.find_element("css selector", "#filters button[type=submit]").click()
    wait_for(lambda: "status=COMPLETED" in browser.current_url)
    table = browser.find_element("id", "runs-table")
    assert done in table.text and live not in table.text
    assert console_errors(browser) == []


def test_the_runs_table_refreshes_itself(served: tuple[str, dex.Engine], browser: Any) -> None:
    base, engine = served
    browser.get(base + "/runs?workflow=web-checkout")
    new = engine.start_workflow(checkout, 99)
    # the refresh was scheduled at load with the page's interval (5 s): wait for it
    assert wait_for(lambda: new in browser.find_element("id", "runs").text, timeout=15)


def test_cancel_from_the_run_page_cancels(served: tuple[str, dex.Engine], browser: Any) -> None:
    base, engine = served
    run_id = engine.start_workflow(waiting)
    wait_for(lambda: engine.get_run(run_id).status is dex.RunStatus.RUNNING)
    browser.get(f"{base}/runs/{run_id}")
    browser.find_element("name", "reason").send_keys("from the browser")
    browser.find_element("id", "cancel").click()
    alert = wait_for(lambda: _alert(browser))
    assert alert is not None and "Cancel this run?" in alert.text
    alert.accept()
    wait_for(lambda: "done=" in browser.current_url)
    assert wait_for(lambda: "cancel requested" in browser.find_element("css selector", ".note").text)
    assert wait_for(lambda: engine.get_run(run_id).status is dex.RunStatus.CANCELLED)
    browser.get(f"{base}/runs/{run_id}")
    assert wait_for(lambda: browser.find_element("id", "run-status").text == "CANCELLED")


def test_dismissing_the_confirmation_does_nothing(served: tuple[str, dex.Engine], browser: Any) -> None:
    base, engine = served
    run_id = engine.start_workflow(waiting)
    browser.get(f"{base}/runs/{run_id}")
    browser.find_element("id", "cancel").click()
    alert = wait_for(lambda: _alert(browser))
    alert.dismiss()
    time.sleep(0.3)
    assert "done=" not in browser.current_url
    assert engine.get_run(run_id).status is not dex.RunStatus.CANCELLED


def test_a_hostile_label_is_shown_as_text(served: tuple[str, dex.Engine], browser: Any) -> None:
    base, engine = served
    run_id = engine.start_workflow(waiting, labels={"note": HOSTILE})
    for path in (f"/runs/{run_id}", "/runs"):
        browser.get(base + path)
        assert browser.title != "owned"
        assert HOSTILE in browser.find_element("tag name", "main").text
        assert browser.execute_script("return document.querySelectorAll('main script').length") == 0
    assert HOSTILE in browser.find_element("id", "runs-table").text


def test_the_overview_draws_the_chart_and_makes_the_screenshot(browser: Any, tmp_path: Path) -> None:
    # an hour of work in virtual time: the chart has something to show in every minute
    clock = VirtualClock(datetime.now(UTC) - timedelta(minutes=60))
    engine = dex.Engine(InMemoryAdapter(clock=clock), workflows=WORKFLOWS, activities=ACTIVITIES)
    engine.create_queue("payments", "activity", capacity=8)
    for minute in range(60):
        for n in range(3 + (minute * 7) % 11):
            engine.start_workflow(checkout, n, labels={"shop": "eu" if n % 2 else "us"})
        if minute % 13 == 5:
            engine.start_workflow(failing)
        engine.drain(advance_time=False)
        clock.advance(timedelta(minutes=1))
    for _ in range(4):
        engine.start_workflow(waiting)
    engine.drain(advance_time=False)
    with serve(create_app(engine)) as base:
        browser.get(base + "/")
        bars = browser.find_elements("css selector", "#minute-chart rect")
        assert len(bars) >= 100, "started and ended bars in (nearly) every minute of the hour"
        assert console_errors(browser) == []
        target = SCREENSHOT if os.environ.get("DEX_UPDATE_SCREENSHOT") == "1" else tmp_path / "dashboard.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_signing_in_with_the_token_opens_the_pages(browser: Any) -> None:
    engine = dex.Engine(InMemoryAdapter(), workflows=WORKFLOWS, activities=ACTIVITIES)
    run_id = engine.start_workflow(checkout, 5)
    with serve(create_app(engine, token="browser-token")) as base:
        browser.get(f"{base}/runs/{run_id}")
        assert "/signin" in browser.current_url
        browser.find_element("name", "token").send_keys("wrong")
        browser.find_element("css selector", "form.signin button").click()
        # the submit navigates: the sign-in page comes again, saying why (the old page's elements go stale)
        assert wait_for(lambda: "not the one" in browser.find_element("tag name", "main").text)
        browser.find_element("name", "token").send_keys("browser-token")
        browser.find_element("css selector", "form.signin button").click()
        wait_for(lambda: browser.current_url.endswith(f"/runs/{run_id}"))
        assert wait_for(lambda: browser.find_element("id", "run-status").text == "CREATED")
        cookies = browser.get_cookies()
        assert all(c["value"] != "browser-token" for c in cookies)
        assert any(c["name"] == "dex_session" and c["httpOnly"] for c in cookies)
        assert browser.execute_script("return document.cookie") == ""  # HttpOnly: scripts cannot read it
        assert "browser-token" not in browser.page_source


def _alert(browser: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return browser.switch_to.alert
    except NoAlertPresentException:
        return None


def test_a_long_history_is_walked_by_its_page_links(browser: Any) -> None:
    from tests.web.test_history_pages import STEPS, long_run

    engine = dex.Engine(InMemoryAdapter(), workflows=[long_run], activities=ACTIVITIES, poll_interval=0.01)
    engine.start()
    try:
        run_id = engine.start_workflow(long_run, STEPS)
        assert engine.wait(run_id, timeout=60) == STEPS
        seqs = [item.sequence_number for item in engine.store.load_history(run_id)]
        with serve(create_app(engine)) as base:
            console_errors(browser)  # reading the log empties it: what earlier pages left goes
            browser.get(f"{base}/runs/{run_id}")

            def shown() -> list[int]:
                rows = browser.find_elements("css selector", "#history tbody tr td:first-child")
                return [int(cell.text) for cell in rows]

            assert wait_for(lambda: shown() == seqs[:500])
            browser.find_element("id", "history-next").click()
            assert wait_for(lambda: shown() == seqs[500:1000])
            browser.find_element("id", "history-last").click()
            last = (len(seqs) - 1) // 500 * 500
            assert wait_for(lambda: shown() == seqs[last:])
            assert f"of {len(seqs)}" in browser.find_element("id", "history-pager").text
            browser.find_element("id", "history-first").click()
            assert wait_for(lambda: shown() == seqs[:500])
            assert console_errors(browser) == []
    finally:
        engine.stop(timeout=5)
