"""Metrics and logs an operator reads: Prometheus counters, structured log records."""

from __future__ import annotations

import logging
import socket
import urllib.request
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.observability.prometheus import PrometheusTelemetry, serve_metrics


@dex.activity(retry=dex.RetryPolicy(max_attempts=2, initial_delay=timedelta(seconds=1)))
def flaky_once(x: int) -> int:
    if dex.activity_context().attempt == 1:
        raise ConnectionError("first attempt fails")
    return x


@dex.workflow
async def observed(ctx: dex.WorkflowContext, x: int) -> int:
    return await ctx.activity(flaky_once, x)  # type: ignore[no-any-return]


def _value(telemetry: PrometheusTelemetry, name: str, labels: dict[str, str] | None = None) -> float:
    value = telemetry.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_prometheus_counts_tasks_outcomes_flushes_and_queues(make_engine: Any) -> None:
    engine = make_engine([observed], [flaky_once])
    telemetry = PrometheusTelemetry()
    engine.telemetry.attach(telemetry)
    run_id = engine.start_workflow(observed, 5)
    engine.drain()
    assert engine.wait(run_id, timeout=1) == 5
    finished = "dex_tasks_finished_total"
    assert _value(telemetry, finished, {"kind": "activity", "name": "flaky_once", "outcome": "retried"}) == 1
    assert _value(telemetry, finished, {"kind": "activity", "name": "flaky_once", "outcome": "completed"}) == 1
    assert _value(telemetry, finished, {"kind": "workflow", "name": "observed", "outcome": "completed"}) == 1
    assert _value(telemetry, "dex_tasks_claimed_total", {"kind": "workflow"}) == 2
    assert _value(telemetry, "dex_flush_size_count") >= 3
    assert _value(telemetry, "dex_task_duration_seconds_count", {"kind": "activity"}) == 2
    telemetry.queue_depths(engine.list_queues())
    assert _value(telemetry, "dex_queue_capacity", {"queue": "default", "kind": "activity"}) == 100


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_metrics_serves_them(make_engine: Any) -> None:
    engine = make_engine([observed], [flaky_once], poll_interval=0.01)
    port = _free_port()
    served = serve_metrics(engine, port)
    assert serve_metrics(engine, _free_port()) is served  # the attached one, not a second
    engine.start()
    try:
        engine.leader.step()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        engine.stop()
    assert "dex_leader 1.0" in body
    assert "dex_tasks_claimed_total" in body


def test_logs_carry_run_and_activity_as_fields(make_engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine([observed], [flaky_once])
    with caplog.at_level(logging.INFO, logger="dex"):
        run_id = engine.start_workflow(observed, 1)
        engine.drain()
    (record,) = [r for r in caplog.records if getattr(r, "activity_name", None) == "flaky_once"]
    assert record.run_id == run_id  # type: ignore[attr-defined]
    assert record.attempt == 1  # type: ignore[attr-defined]
    assert "retried" in record.getMessage()


def test_dex_is_quiet_by_default() -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("dex").handlers)
