"""`dex worker MODULE:ENGINE`: finding the application's engine, and a graceful stop on a signal."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import dex
from dex.cli.database import CommandError
from dex.cli.worker import load_engine
from tests.cli.conftest import invoke, one_line_error
from tests.pg import fresh_schema

ROOT = Path(__file__).resolve().parents[2]

APP = '''
"""A user's application: one workflow whose activity takes a while and leaves a trace."""
import os
import time

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.activity(name="pack")
def pack(order_id: str) -> str:
    with open(os.environ["APP_MARKER"], "a") as marker:
        marker.write("start\\n")
    time.sleep(1.5)
    with open(os.environ["APP_MARKER"], "a") as marker:
        marker.write("end\\n")
    return f"parcel-{order_id}"


@dex.workflow(name="ship")
async def ship(ctx: dex.WorkflowContext, order_id: str) -> str:
    return await ctx.activity(pack, order_id)


engine = dex.Engine(
    PostgresAdapter(os.environ["APP_DSN"], schema=os.environ["APP_SCHEMA"]),
    workflows=[ship],
    activities=[pack],
    poll_interval=0.05,
)
'''


def write_module(directory: Path, source: str) -> str:
    """A module with a name no other test uses (the test process imports some of them too)."""
    name = f"cliapp_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(source)
    return name


def import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def app(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Path, str, dict[str, str]]]:
    with fresh_schema(pg_dsn, prefix="dex_cli_worker") as schema:
        name = write_module(tmp_path, APP)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "APP_DSN": pg_dsn,
            "APP_SCHEMA": schema,
            "APP_MARKER": str(tmp_path / "marker.txt"),
        }
        yield tmp_path, name, env


@pytest.mark.postgres
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_runs_the_apps_engine_and_stops_gracefully(
    app: tuple[Path, str, dict[str, str]], signum: signal.Signals, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, name, env = app
    for key in ("APP_DSN", "APP_SCHEMA", "APP_MARKER"):
        monkeypatch.setenv(key, env[key])
    client = import_file(directory / f"{name}.py")  # the same code, as the application's client
    run_id = client.engine.start_workflow("ship", "A-7")
    marker = directory / "marker.txt"
    log = directory / "worker.log"
    with open(log, "w") as stderr:
        worker = subprocess.Popen(
            # -P: Python itself puts no directory on sys.path (as with the `dex` console script),
            # so finding the module in the current directory is the command's doing
            [sys.executable, "-P", "-m", "dex", "worker", f"{name}:engine"],
            cwd=directory,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:

            def activity_started() -> bool:
                assert worker.poll() is None, log.read_text()  # the worker must not have given up
                return marker.exists() and "start" in marker.read_text()

            wait_for(activity_started)
            worker.send_signal(signum)  # while the activity is in flight
            assert worker.wait(timeout=60) == 0, log.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    output = log.read_text()
    assert "started (workflows: ship [default]; activities: pack [default])" in output
    assert f"received {signum.name}: stopping" in output
    assert output.rstrip().endswith("stopped")
    assert marker.read_text() == "start\nend\n"  # the in-flight activity finished

    # its outcome was written before the worker exited: finishing the run does not redo it
    client.engine.drain()
    assert client.engine.wait(run_id, timeout=10) == "parcel-A-7"
    assert marker.read_text() == "start\nend\n"
    client.engine.store.close()


ENGINES = """
import dex
from dex.adapters.memory import InMemoryAdapter

engine = dex.Engine(InMemoryAdapter())
not_an_engine = 42

class holder:
    engine = engine

def make_engine():
    return engine

def broken_factory():
    raise RuntimeError("no config")
"""


@pytest.fixture
def engines_module(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    name = write_module(tmp_path, ENGINES)
    saved = list(sys.path)
    yield tmp_path, name
    sys.path[:] = saved
    sys.modules.pop(name, None)


@pytest.mark.parametrize("attribute", ["engine", "holder.engine", "make_engine"])
def test_the_target_may_be_an_engine_a_dotted_path_or_a_factory(
    engines_module: tuple[Path, str], attribute: str
) -> None:
    directory, name = engines_module
    engine = load_engine(f"{name}:{attribute}", str(directory))
    assert isinstance(engine, dex.Engine)
    assert engine is sys.modules[name].engine


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{name}_missing:engine", "cannot import '{name}_missing': No module named '{name}_missing'"),
        ("{name}:nothing", "module '{name}' has no attribute 'nothing'"),
        ("{name}:not_an_engine", "{name}:not_an_engine is a int, not a dex.Engine (or a function returning one)"),
        ("{name}:broken_factory", "calling {name}:broken_factory failed: RuntimeError: no config ("),
    ],
)
def test_a_target_that_is_no_engine_is_a_one_line_error(
    engines_module: tuple[Path, str], target: str, message: str
) -> None:
    directory, name = engines_module
    with pytest.raises(CommandError) as caught:
        load_engine(target.format(name=name), str(directory))
    assert caught.value.format_message().startswith(message.format(name=name))
    result = invoke("worker", "--app-dir", str(directory), target.format(name=name))
    assert result.exit_code == 1
    assert one_line_error(result).startswith("error: " + message.format(name=name))


def test_an_app_module_that_raises_on_import_is_reported_with_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = write_module(tmp_path, "x = 1\nraise ValueError('bad settings')\n")
    result = invoke("worker", "--app-dir", str(tmp_path), f"{name}:engine")
    assert result.exit_code == 1
    line = one_line_error(result)
    assert line.startswith(f"error: importing '{name}' failed: ValueError: bad settings (")
    assert line.endswith(f"{name}.py:2)")


@pytest.mark.parametrize(
    ("source", "says"),
    [
        # fails in <frozen os>: the user's line is the one that read the variable
        (
            "import os\n\nDSN = os.environ['CLIAPP_UNSET_VARIABLE']\n",
            "KeyError: 'CLIAPP_UNSET_VARIABLE' - an environment variable that is not set (",
        ),
        # fails deep in the standard library's json module
        ("import json\n\nSETTINGS = json.loads('{not json')\n", "JSONDecodeError: Expecting property name"),
    ],
)
def test_an_import_that_fails_in_library_code_is_reported_at_the_apps_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, says: str
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("CLIAPP_UNSET_VARIABLE", raising=False)
    name = write_module(tmp_path, source)
    result = invoke("worker", "--app-dir", str(tmp_path), f"{name}:engine")
    assert result.exit_code == 1
    line = one_line_error(result)
    assert line.startswith(f"error: importing '{name}' failed: {says}"), line
    assert line.endswith(f"({tmp_path / name}.py:3)"), line


def test_an_app_whose_dsn_is_no_dsn_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    source = "import dex\nfrom dex.adapters.postgres import PostgresAdapter\n\nengine = dex.Engine(PostgresAdapter('postgresql://app:s3cret@db:99999/shop'))\n"
    name = write_module(tmp_path, source)
    result = invoke("worker", "--app-dir", str(tmp_path), f"{name}:engine")
    assert result.exit_code == 2
    line = one_line_error(result)
    assert "its port is not a number from 1 to 65535" in line and "s3cret" not in line
    assert line.endswith(f"({tmp_path / name}.py:4)"), line


SLOW_APP = '''
"""An application whose activity's first attempt takes a minute."""
import os
import time
from datetime import timedelta

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.activity(name="pack", lock_timeout=timedelta(seconds=5))
def pack(order_id: str) -> str:
    attempt = dex.activity_context().attempt
    with open(os.environ["APP_MARKER"], "a") as marker:
        marker.write(f"start {attempt}\\n")
    if attempt == 1:
        time.sleep(60)
    return f"parcel-{order_id}"


@dex.workflow(name="ship")
async def ship(ctx: dex.WorkflowContext, order_id: str) -> str:
    return await ctx.activity(pack, order_id)


engine = dex.Engine(
    PostgresAdapter(os.environ["APP_DSN"], schema=os.environ["APP_SCHEMA"]),
    workflows=[ship],
    activities=[pack],
    poll_interval=0.05,
)
'''


@pytest.mark.postgres
def test_stop_timeout_bounds_the_graceful_stop_and_the_abandoned_attempt_runs_again_elsewhere(
    app: tuple[Path, str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _, env = app
    name = write_module(directory, SLOW_APP)
    for key in ("APP_DSN", "APP_SCHEMA", "APP_MARKER"):
        monkeypatch.setenv(key, env[key])
    client = import_file(directory / f"{name}.py")
    run_id = client.engine.start_workflow("ship", "B-2")
    marker = directory / "marker.txt"
    log = directory / "worker.log"
    with open(log, "w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-P", "-m", "dex", "worker", "--stop-timeout", "1", f"{name}:engine"],
            cwd=directory,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_for(lambda: marker.exists() and "start 1" in marker.read_text())
            worker.send_signal(signal.SIGTERM)  # one signal: a graceful stop, bounded by 1 s
            signalled = time.monotonic()
            try:
                code = worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the worker did not stop within 15 s\n{log.read_text()}")
            took = time.monotonic() - signalled
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    output = log.read_text()
    assert code == 0, output
    assert took < 6, f"the worker took {took:.1f} s to stop with --stop-timeout 1\n{output}"
    assert "abandoned to their leases" in output
    assert "exiting with 1 abandoned activity attempt(s) still running" in output
    assert "Traceback" not in output

    # the abandoned attempt wrote nothing; once its lease lapses another engine runs it again
    def finished() -> bool:
        client.engine.drain(advance_time=False)
        return client.engine.get_run(run_id).status is dex.RunStatus.COMPLETED

    wait_for(finished, timeout=30)
    assert client.engine.wait(run_id, timeout=1) == "parcel-B-2"
    assert marker.read_text() == "start 1\nstart 2\n"
    client.engine.store.close()
