"""``dex.remote.worker.Worker`` against a real ``dex web`` (docs/reference/contract.md §16): results,
retryable and terminal failures, heartbeats, cancellation, the concurrency limit, drain on
SIGTERM, and the poison a worker must survive (hostile values and exceptions, a server that
fails or goes away), each followed by a healthy task that completes."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.domain.status import RunStatus
from dex.remote import ActivityTaskService, PolledTask, PollLimitError
from dex.remote.worker import Worker
from tests.remote.support import free_port
from tests.remote.worker_support import TOKEN, call, dex_web, failure_text, running, sdk_engine

ROOT = Path(__file__).resolve().parents[2]


class FaultyService(ActivityTaskService):
    """The service, failing its first calls as told (a 500, or a 503 with ``Retry-After``) and
    noting when each call came."""

    def __init__(self, *args: Any, faults: dict[str, list[Exception]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults or {}
        self.calls: dict[str, list[float]] = {"poll": [], "complete": [], "fail": [], "heartbeat": []}

    def _note(self, kind: str) -> None:
        self.calls[kind].append(time.monotonic())
        if self.faults.get(kind):
            raise self.faults[kind].pop(0)

    async def poll_async(self, *args: Any, **kwargs: Any) -> list[PolledTask]:
        self._note("poll")
        return await super().poll_async(*args, **kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> None:
        self._note("complete")
        super().complete(*args, **kwargs)

    def fail(self, *args: Any, **kwargs: Any) -> None:
        self._note("fail")
        super().fail(*args, **kwargs)

    def heartbeat(self, *args: Any, **kwargs: Any) -> bool:
        self._note("heartbeat")
        return super().heartbeat(*args, **kwargs)


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[dex.Engine]:
    with sdk_engine(request.param) as engine:
        yield engine


@pytest.fixture
def memory_engine() -> Iterator[dex.Engine]:
    with sdk_engine("memory") as engine:
        yield engine


def serve(engine: dex.Engine, **options: Any) -> tuple[FaultyService, Any]:
    service = FaultyService(engine, poll_interval=0.2, **options)
    return service, dex_web(engine, service, free_port())


def worker(url: str, **options: Any) -> Worker:
    options.setdefault("poll_wait_seconds", 1.0)
    options.setdefault("max_heartbeat_interval", 0.2)
    return Worker(url, token=options.pop("token", TOKEN), **options)


def with_echo(w: Worker) -> Worker:
    @w.activity("echo")
    def echo(value: Any) -> Any:
        return value

    return w


def healthy(engine: dex.Engine) -> None:
    """A healthy task after the poison: it completes."""
    run_id = engine.start_workflow(call, "echo", [{"ok": [1, 2.5, None, True]}])
    assert engine.wait(run_id, timeout=30) == {"ok": [1, 2.5, None, True]}


def test_results_and_failures_reach_the_workflow(engine: dex.Engine) -> None:
    attempts: dict[str, int] = {}
    service, web = serve(engine)
    with web as url:
        w = with_echo(worker(url))

        @w.activity("flaky")
        def flaky(key: str) -> str:
            attempts[key] = attempts.get(key, 0) + 1
            if attempts[key] < 3:
                raise ConnectionError(f"try {attempts[key]}")
            return f"{key} after {attempts[key]}"

        @w.activity("refuse")
        async def refuse(message: str) -> None:
            await asyncio.sleep(0)
            raise dex.TerminalError(message)

        @w.activity("always")
        def always() -> None:
            raise ValueError("never works")

        async def add(a: int, b: int) -> int:
            await asyncio.sleep(0)
            return a + b

        w.activity("add-ten")(functools.partial(add, 10))  # returns an awaitable without being an async def

        with running(w):
            assert engine.wait(engine.start_workflow(call, "flaky", ["a"]), timeout=30) == "a after 3"
            assert engine.wait(engine.start_workflow(call, "add-ten", [5]), timeout=30) == 15
            refused = engine.start_workflow(call, "refuse", ["no such image"])
            with pytest.raises(dex.WorkflowFailedError) as failed:
                engine.wait(refused, timeout=30)
            assert "TerminalError: no such image" in failure_text(failed.value)
            spent = engine.start_workflow(call, "always", [], 2)
            with pytest.raises(dex.WorkflowFailedError) as failed:
                engine.wait(spent, timeout=30)
            assert "ValueError: never works" in failure_text(failed.value)
            healthy(engine)
    assert len(service.calls["fail"]) == 2 + 1 + 2  # flaky twice, refuse once (terminal), always twice


def test_retry_after_replaces_the_policy_delay(memory_engine: dex.Engine) -> None:
    times: list[float] = []
    _service, web = serve(memory_engine)
    with web as url:
        w = worker(url)

        @w.activity("later")
        def later() -> str:
            times.append(time.monotonic())
            if len(times) == 1:
                raise dex.ApplicationError("busy", retry_after=1.0)
            return "done"

        with running(w):
            assert memory_engine.wait(memory_engine.start_workflow(call, "later", []), timeout=30) == "done"
    assert times[1] - times[0] >= 0.95  # the policy alone would retry after 0.01 s


def test_heartbeats_keep_a_task_longer_than_its_lease(memory_engine: dex.Engine) -> None:
    calls: list[int] = []
    service, web = serve(memory_engine, lease=timedelta(seconds=1))
    with web as url:
        w = worker(url, max_heartbeat_interval=5.0)  # every third of the 1 s lease

        @w.activity("long")
        def long(seconds: float) -> str:
            calls.append(dex.activity_context().attempt)
            time.sleep(seconds)
            return "kept"

        with running(w):
            assert memory_engine.wait(memory_engine.start_workflow(call, "long", [3.0]), timeout=30) == "kept"
    assert calls == [1]  # never lost to the lease and run again
    assert len(service.calls["heartbeat"]) >= 6


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancellation_reaches_the_function(memory_engine: dex.Engine, kind: str) -> None:
    seen: dict[str, Any] = {}
    started = threading.Event()
    service, web = serve(memory_engine)
    with web as url:
        w = with_echo(worker(url))

        @w.activity("watch-sync")
        def watch_sync() -> str:
            context = dex.activity_context()
            started.set()
            deadline = time.monotonic() + 20
            while not context.cancel_requested and time.monotonic() < deadline:
                time.sleep(0.02)
            seen["told"] = (context.cancel_requested, context.heartbeat(), time.monotonic())
            return "finished anyway"

        @w.activity("watch-async")
        async def watch_async() -> str:
            started.set()
            try:
                await asyncio.sleep(20)
            except asyncio.CancelledError:
                seen["told"] = (dex.activity_context().cancel_requested, False, time.monotonic())
                raise
            return "slept"

        with running(w):
            run_id = memory_engine.start_workflow(call, f"watch-{kind}", [])
            assert started.wait(10)
            cancelled_at = time.monotonic()
            memory_engine.cancel(run_id)
            deadline = time.monotonic() + 10
            while "told" not in seen:
                assert time.monotonic() < deadline, "the function was never told"
                time.sleep(0.02)
            assert memory_engine.get_run(run_id).status is RunStatus.CANCELLED
            healthy(memory_engine)
    cancel_requested, heartbeat, told_at = seen["told"]
    assert cancel_requested is True and heartbeat is False
    assert told_at - cancelled_at < 5
    assert service.calls["complete"] == [service.calls["complete"][-1]]  # only the healthy task's


def test_concurrency_limits_the_tasks_held(memory_engine: dex.Engine) -> None:
    lock = threading.Lock()
    now, most = [0], [0]
    _service, web = serve(memory_engine)
    with web as url:
        w = worker(url, concurrency=2)

        @w.activity("busy")
        def busy(i: int) -> int:
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            time.sleep(0.4)
            with lock:
                now[0] -= 1
            return i

        with running(w):
            runs = [memory_engine.start_workflow(call, "busy", [i]) for i in range(6)]
            assert [memory_engine.wait(r, timeout=30) for r in runs] == list(range(6))
    assert most[0] == 2


def test_poison_values_get_their_clear_error_and_a_healthy_task_completes(memory_engine: dex.Engine) -> None:
    with pytest.raises(ValueError, match="NUL or a lone surrogate"):
        Worker("http://127.0.0.1:1", worker_id="w\x00")
    with pytest.raises(ValueError, match="NUL or a lone surrogate"):
        Worker("http://127.0.0.1:1", worker_id="w\ud800")
    with pytest.raises(ValueError, match="token"):
        Worker("http://127.0.0.1:1", token="t\x00ken")
    with pytest.raises(ValueError, match="concurrency"):
        Worker("http://127.0.0.1:1", concurrency=0)
    with pytest.raises(ValueError, match="url"):
        Worker("ftp://127.0.0.1:1")
    bad = Worker("http://127.0.0.1:1")
    for name in ("a\x00b", "a\udc80b", ""):
        with pytest.raises(ValueError):
            bad.activity(name)
    with pytest.raises(RuntimeError, match="no activity"):
        bad.run()
    first, second = bad.activity("twice"), bad.activity("twice")
    first(len)
    with pytest.raises(ValueError, match="registered already"):
        second(len)
    with pytest.raises(ValueError, match="registered already"):
        bad.activity("twice")

    _service, web = serve(memory_engine)
    with web as url:
        w = with_echo(worker(url))

        @w.activity("surrogate")
        def surrogate() -> str:
            return "lone \ud800 here"

        @w.activity("not-json")
        def not_json() -> Any:
            return {1, 2}

        @w.activity("big")
        def big() -> str:
            return "x" * 3_000_000  # over the 2 MiB payload limit

        @w.activity("huge-message")
        def huge_message() -> None:
            raise dex.TerminalError("y" * 3_000_000)

        @w.activity("loud")
        def loud() -> None:
            raise dex.TerminalError("nul \x00 and lone \udfff in a message")

        with running(w):
            nul = {"k\x00ey": ["v\x00lue", "\x00"]}
            assert memory_engine.wait(memory_engine.start_workflow(call, "echo", [nul]), timeout=30) == nul
            for name, text in [
                ("surrogate", "SerializationError"),
                ("not-json", "SerializationError"),
                ("big", "InvalidValue"),
                ("huge-message", "[truncated: 3,000,000 characters"),
                ("loud", "nul \x00 and lone \\udfff in a message"),
            ]:
                with pytest.raises(dex.WorkflowFailedError) as failed:
                    memory_engine.wait(memory_engine.start_workflow(call, name, []), timeout=30)
                assert text in failure_text(failed.value), name
            arity = memory_engine.start_workflow(call, "echo", [1, 2])  # echo takes one argument
            with pytest.raises(dex.WorkflowFailedError) as failed:
                memory_engine.wait(arity, timeout=30)
            assert "TypeError" in failure_text(failed.value)
            healthy(memory_engine)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (Unprintable(), "<unprintable Unprintable"),
        (KeyboardInterrupt("from the activity"), "KeyboardInterrupt: from the activity"),
        (SystemExit(3), "SystemExit: 3"),
    ],
    ids=["unprintable", "keyboard-interrupt", "system-exit"],
)
def test_hostile_exceptions_are_failures_of_their_task(
    memory_engine: dex.Engine, raised: BaseException, expected: str
) -> None:
    _service, web = serve(memory_engine)
    with web as url:
        w = with_echo(worker(url))

        @w.activity("hostile")
        def hostile() -> None:
            raise raised

        with running(w):
            with pytest.raises(dex.WorkflowFailedError) as failed:
                memory_engine.wait(memory_engine.start_workflow(call, "hostile", [], 2), timeout=30)
            assert expected in failure_text(failed.value)
            healthy(memory_engine)


def test_server_faults_are_retried_with_backoff(memory_engine: dex.Engine) -> None:
    faults: dict[str, list[Exception]] = {
        "poll": [RuntimeError("store down"), PollLimitError("too many polls"), RuntimeError("store down")],
        "complete": [RuntimeError("store down"), RuntimeError("store down")],
        "heartbeat": [RuntimeError("store down")],
    }
    service, web = serve(memory_engine)
    service.faults = faults
    with web as url:
        w = with_echo(worker(url))

        @w.activity("pause")
        def pause() -> str:
            time.sleep(0.6)  # heartbeats come meanwhile
            return "paused"

        with running(w):
            run_id = memory_engine.start_workflow(call, "pause", [])
            assert memory_engine.wait(run_id, timeout=60) == "paused"
            healthy(memory_engine)
    polls, completes = service.calls["poll"], service.calls["complete"]
    assert polls[1] - polls[0] >= 0.25  # a 500: half of 0.5 s at least
    assert polls[2] - polls[1] >= 0.95  # the 503's Retry-After: 1
    assert polls[3] - polls[2] >= 0.5  # then the pause doubles
    assert completes[1] - completes[0] >= 0.25 and completes[2] - completes[1] >= 0.5
    assert not any(faults.values())
    assert memory_engine.get_run(run_id).status is RunStatus.COMPLETED


def test_a_server_going_away_mid_task_is_waited_for_and_a_wrong_token_never_loops(
    memory_engine: dex.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dex.remote.worker")
    port = free_port()
    service = FaultyService(memory_engine, poll_interval=0.2)
    started = threading.Event()
    w = with_echo(worker(f"http://127.0.0.1:{port}"))

    @w.activity("pause")
    def pause() -> str:
        started.set()
        time.sleep(1.5)  # the server goes away meanwhile
        return "paused"

    with running(w):
        with dex_web(memory_engine, service, port):
            healthy(memory_engine)
            run_id = memory_engine.start_workflow(call, "pause", [])
            assert started.wait(10)
        # gone: the task's heartbeats and complete, and the polls, find no server
        time.sleep(3)
        messages = [r.getMessage() for r in caplog.records]
        polls = [m for m in messages if "poll failed" in m]
        reports = [m for m in messages if "report failed" in m]
        assert 1 <= len(polls) <= 5, polls  # 0.5, 1, 2 s apart: no hot loop
        assert 1 <= len(reports) <= 4, reports
        with dex_web(memory_engine, service, port):
            assert memory_engine.wait(run_id, timeout=30) == "paused"  # the complete went through at last
            healthy(memory_engine)
    assert len(service.calls["complete"]) == 3  # the healthy ones and the one sent again

    caplog.clear()
    with dex_web(memory_engine, service, port) as url, running(with_echo(worker(url, token="wrong"))):
        time.sleep(2)
    refused = [r for r in caplog.records if "poll failed" in r.getMessage()]
    assert 1 <= len(refused) <= 4 and "401" in refused[0].getMessage()


def test_a_cut_or_broken_answer_is_a_failed_poll(caplog: pytest.LogCaptureFixture) -> None:
    """A server (or proxy) that cuts its answer short, or answers what is not the API's, is
    polled again after the same growing pauses; the worker's loop never ends on it."""
    caplog.set_level(logging.WARNING, logger="dex.remote.worker")
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[",  # cut short
        b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"a": 1}',  # JSON, but not a list of tasks
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\n<html",  # a proxy's page
        b"NOT HTTP AT ALL\r\n\r\n",
    ]

    class Broken(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(answers[min(len(seen), len(answers) - 1)])
            seen.append(time.monotonic())

    seen: list[float] = []
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Broken) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        w = with_echo(Worker(f"http://127.0.0.1:{server.server_address[1]}", poll_wait_seconds=0))
        with running(w):
            time.sleep(4)
        server.shutdown()
    failures = [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()]
    assert 3 <= len(failures) <= 5, failures  # 0.25-0.5, 0.5-1, 1-2 s apart
    assert all(later - earlier >= 0.24 for earlier, later in itertools.pairwise(seen)), seen


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_the_worker_and_it_exits_0(engine: dex.Engine, tmp_path: Path, stop: signal.Signals) -> None:
    script = tmp_path / "worker.py"
    marker = tmp_path / "started"
    script.write_text(
        "import sys, time, pathlib\n"
        "from dex.remote.worker import Worker\n"
        "worker = Worker(sys.argv[1], token=sys.argv[2], concurrency=1, poll_wait_seconds=1)\n"
        "@worker.activity('sdk-slow')\n"
        "def slow(seconds):\n"
        "    pathlib.Path(sys.argv[3]).write_text('started')\n"
        "    time.sleep(seconds)\n"
        "    return {'slept': seconds}\n"
        "worker.run()\n"
        "print('drained', flush=True)\n"
    )
    _service, web = serve(engine)
    with web as url:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        process = subprocess.Popen(
            [sys.executable, str(script), url, TOKEN, str(marker)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            first = engine.start_workflow(call, "sdk-slow", [2])
            deadline = time.monotonic() + 30
            while not marker.exists():
                assert process.poll() is None and time.monotonic() < deadline, "the task never started"
                time.sleep(0.02)
            process.send_signal(stop)
            time.sleep(0.2)
            second = engine.start_workflow(call, "sdk-slow", [0])
            output, _ = process.communicate(timeout=30)
        finally:
            process.kill()
        assert process.returncode == 0, output
        assert "drained" in output
        assert engine.wait(first, timeout=10) == {"slept": 2}  # the task in flight was finished
        time.sleep(0.5)
        # its one place was taken, so no poll was in flight at the signal, and none was made after it
        assert engine.get_run(second).status is RunStatus.RUNNING
        w = worker(url)

        @w.activity("sdk-slow")
        def slow(seconds: int) -> dict[str, int]:
            return {"slept": seconds}

        with running(w):
            assert engine.wait(second, timeout=30) == {"slept": 0}


def test_the_worker_needs_no_web_extra() -> None:
    """A process with nothing but dex installed runs a worker: the web and gRPC packages are
    made unimportable, and the worker imports, builds and registers all the same."""
    code = (
        "import sys\n"
        "for name in ('starlette', 'uvicorn', 'jinja2', 'httpx', 'grpc'):\n"
        "    sys.modules[name] = None  # an import of it raises ImportError\n"
        "from dex.remote.worker import Worker\n"
        "worker = Worker('http://127.0.0.1:1', concurrency=2)\n"
        "worker.activity('echo')(lambda value: value)\n"
        "print('imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr
