"""Screenshots of every dashboard page over a demo engine, to look at after a change of the pages.

    python scripts/screenshots.py /tmp/shots

makes an engine over the memory adapter with an hour of work in virtual time (completed runs,
a run whose step was retried before it succeeded, failed runs, a parent with children, runs
waiting for an event, labels and instance ids), two queues (one paused) and two schedules (one
paused), serves the dashboard on 127.0.0.1 with uvicorn and saves, with headless Chromium
(the browser tests' setup: ``apt-get install chromium chromium-driver``), a full-page PNG of
each page into the directory given: overview, runs (top-level, every level, a run's children),
a run (retried, failed, parent), queues, schedules and workers (the demo engine and a second,
activities-only one, both started). It prints each file's path.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock
from dex.web import create_app

WIDTH = 1280


@dex.activity(name="charge-card", retry=dex.RetryPolicy(max_attempts=4, initial_delay=timedelta(seconds=20)))
def charge_card(order: str, amount: int) -> str:
    attempt = dex.activity_context().attempt
    if order.endswith("-flaky") and attempt < 3:  # the gateway times out twice, then answers
        raise ConnectionError(f"payment gateway timed out (attempt {attempt})")
    return f"charge-{order}-{amount}"


@dex.activity(name="ship-parcel", retry=dex.RetryPolicy(max_attempts=2, initial_delay=timedelta(seconds=5)))
def ship_parcel(order: str) -> str:
    if order.endswith("-lost"):
        raise LookupError(f"no address on file for order {order}")
    return f"parcel-{order}"


@dex.workflow(name="order")
async def order(ctx: dex.WorkflowContext, order_id: str, amount: int) -> dict[str, str]:
    ctx.set_status("charging card")
    charge = await ctx.activity(charge_card, order_id, amount)
    ctx.set_status("shipping")
    parcel = await ctx.activity(ship_parcel, order_id)
    ctx.set_status("shipped")
    return {"charge": charge, "parcel": parcel}


@dex.workflow(name="batch")
async def batch(ctx: dex.WorkflowContext, orders: list[str]) -> list[Any]:
    return [await ctx.child(order, order_id, 10) for order_id in orders]


@dex.workflow(name="approval")
async def approval(ctx: dex.WorkflowContext, request: str) -> Any:
    ctx.set_status("waiting for a manager")
    return await ctx.wait_for_event("approved", timeout=timedelta(days=2))


def demo_engine() -> tuple[dex.Engine, dict[str, str]]:
    """The engine with an hour of work behind it, and the runs worth a page of their own."""
    clock = VirtualClock(datetime.now(UTC) - timedelta(minutes=60))
    schedules = [
        dex.Schedule("nightly-batch", batch, cron="0 3 * * *", args=(["n-1", "n-2"],)),
        dex.Schedule("approval-reminder", approval, every=timedelta(hours=4), args=("reminder",)),
    ]
    engine = dex.Engine(
        InMemoryAdapter(clock=clock),
        workflows=[order, batch, approval],
        activities=[charge_card, ship_parcel],
        schedules=schedules,
    )
    engine.create_queue("payments", "activity", capacity=8)
    engine.create_queue("bulk", "workflow", capacity=2)
    engine.pause_queue("bulk", "workflow")
    engine.pause_schedule("approval-reminder", note="holiday: no reminders until Monday")
    shown: dict[str, str] = {}
    for minute in range(60):
        for n in range(2 + (minute * 7) % 9):
            shop = "eu" if n % 2 else "us"
            engine.start_workflow(order, f"A-{minute}-{n}", 10 + n, labels={"shop": shop})
        if minute % 17 == 4:
            shown["failed"] = engine.start_workflow(order, f"B-{minute}-lost", 99, labels={"shop": "eu"})
        engine.drain(advance_time=False)
        clock.advance(timedelta(minutes=1))
    shown["retried"] = engine.start_workflow(
        order, "C-7-flaky", 42, instance_id="order-C-7", labels={"shop": "eu", "channel": "phone"}
    )
    shown["parent"] = engine.start_workflow(batch, ["D-1", "D-2", "D-3-lost"], instance_id="batch-2026-12-02")
    engine.trigger_schedule("nightly-batch")  # a schedule with a last fire and run to show
    engine.drain()  # the retries' delays pass in virtual time
    for request in ("laptop", "monitor"):
        engine.start_workflow(approval, request, labels={"team": "it"})
    engine.drain(advance_time=False)
    return engine, shown


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise SystemExit("no Chromium and chromedriver installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},900")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shoot(driver: Any, url: str, target: Path) -> None:
    """A PNG of the whole page at ``url`` (the window grown to the page's height)."""
    driver.set_window_size(WIDTH, 900)
    driver.get(url)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(max(int(height) + 140, 600), 6000))
    if not driver.save_screenshot(str(target)):
        raise RuntimeError(f"no screenshot of {url}")
    print(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where the PNG files go (made if missing)")
    args = parser.parse_args(argv)
    args.directory.mkdir(parents=True, exist_ok=True)
    engine, shown = demo_engine()
    pages = {
        "overview": "/",
        "runs": "/runs",
        "runs-every-level": "/runs?level=all",
        "runs-children": f"/runs?parent_run_id={shown['parent']}",
        "run-retried": f"/runs/{shown['retried']}",
        "run-failed": f"/runs/{shown['failed']}",
        "run-parent": f"/runs/{shown['parent']}",
        "queues": "/queues",
        "schedules": "/schedules",
    }
    # the Workers page lists live engines: this one and a second, activities-only worker, started
    worker = dex.Engine(
        engine.store, activities=[charge_card, ship_parcel], node_id="payments-worker-2", code_version="v42"
    )
    engine.start()
    worker.start()
    try:
        with serve(create_app(engine)) as base, chromium() as driver:
            for name, path in {**pages, "workers": "/workers"}.items():
                shoot(driver, base + path, args.directory / f"{name}.png")
    finally:
        worker.stop()
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
