"""``dex worker MODULE:ENGINE``: run the engine that application code defines until told to stop.

The engine is the application's own ``dex.Engine`` (with its adapter, workflows and
activities), found like other tools find an app object (``uvicorn main:app``): the module is
imported with the application directory (the current one unless ``--app-dir`` says otherwise)
first on ``sys.path``. The attribute may also be a function that takes no arguments and
returns an engine.

SIGTERM or SIGINT (Ctrl-C) stops the worker gracefully: ``Engine.stop`` stops polling, lets
in-flight tasks finish, flushes buffered outcomes and releases leadership, so nothing the
worker acknowledged is lost. ``--stop-timeout`` bounds that wait: activity attempts still
running then are abandoned to their leases (another worker runs them again once the leases
lapse) and the process exits without waiting for their threads. A second signal while it
waits exits at once; the tasks it still held are retried by other workers when their leases
expire.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

import click

import dex
from dex.adapters.postgres.connection import InvalidDsnError
from dex.app.facade.engine import Engine
from dex.app.machinery.threads import ACTIVITY_THREADS
from dex.cli.database import CommandError, UsageProblem, progress
from dex.cli.params import SECONDS, TEXT, TextPath

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def load_engine(spec: str, app_dir: str = ".") -> Engine:
    """Import ``module:attribute`` (the attribute may be dotted) and return the engine it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r} is not MODULE:ENGINE (e.g. myapp.workers:engine)", param_hint="'TARGET'")
    directory = str(Path(app_dir).resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CommandError(f"cannot import {module_name!r}: {exc} (looked in {directory} and sys.path)") from None
        raise _failed(f"importing {module_name!r}", exc) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised: say what and where, in one line
        raise _failed(f"importing {module_name!r}", exc) from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Engine) and callable(target):
        try:
            target = target()
        except Exception as exc:  # noqa: BLE001
            raise _failed(f"calling {spec}", exc) from None
    if not isinstance(target, Engine):
        raise CommandError(f"{spec} is a {type(target).__name__}, not a dex.Engine (or a function returning one)")
    return target


def _failed(doing: str, exc: BaseException) -> click.ClickException:
    """The one-line error for the application's code raising ``exc``: a DSN that is no DSN is
    a usage error (2), as it is on the command line; anything else exit code 1."""
    message = f"{doing} failed: {where(exc)}"
    return UsageProblem(message) if isinstance(exc, InvalidDsnError) else CommandError(message)


_PATHS = sysconfig.get_paths()
_SITE = tuple({str(Path(_PATHS[key]).resolve()) for key in ("purelib", "platlib")})
# in a venv, platstdlib is the venv's lib/pythonX.Y, which holds site-packages: see _is_stdlib
_STDLIB = tuple({str(Path(_PATHS[key]).resolve()) for key in ("stdlib", "platstdlib")})
_LIBRARIES = (*_SITE, str(Path(dex.__file__).parent.resolve()))  # installed packages, and dex itself


def where(exc: BaseException) -> str:
    """``TYPE: message (FILE:LINE)``, FILE:LINE the innermost place in the application's own code:
    ``os.environ["X"]`` fails in ``<frozen os>``, which tells the user nothing, the line that
    read it does. Not in the standard library, an installed package or dex, if the traceback has
    such a place (an application installed as a package has none: then not in the standard
    library), else the innermost place of all."""
    frames = traceback.extract_tb(exc.__traceback__)
    files = [frame for frame in frames if not frame.filename.startswith("<")]  # not <frozen os>, <string>
    not_stdlib = [frame for frame in files if not _is_stdlib(frame.filename)]
    own = [frame for frame in not_stdlib if not _under(frame.filename, _LIBRARIES)]
    frame = next((tier[-1] for tier in (own, not_stdlib, frames) if tier), None)
    place = f" ({frame.filename}:{frame.lineno})" if frame is not None else ""
    hint = ""
    if isinstance(exc, KeyError) and frames and _is_environ(frames[-1].filename):
        hint = " - an environment variable that is not set"
    return f"{type(exc).__name__}: {exc}{hint}{place}"


def _is_stdlib(filename: str) -> bool:
    return _under(filename, _STDLIB) and not _under(filename, _SITE)


def _under(filename: str, roots: tuple[str, ...]) -> bool:
    resolved = str(Path(filename).resolve())
    return any(resolved == root or resolved.startswith(root + os.sep) for root in roots)


def _is_environ(filename: str) -> bool:
    return filename == "<frozen os>" or Path(filename).resolve() == Path(os.__file__).resolve()


def describe(engine: Engine) -> str:
    workflows = ", ".join(f"{name} [{d.queue}]" for name, d in sorted(engine.registry.workflows.items())) or "none"
    activities = ", ".join(f"{name} [{d.queue}]" for name, d in sorted(engine.registry.activities.items())) or "none"
    return f"workflows: {workflows}; activities: {activities}"


def run_worker(engine: Engine, stop_timeout: float) -> int:
    """Start ``engine``, wait for SIGTERM/SIGINT, stop it gracefully; return the exit code.

    Attempts the stop abandoned do not hold up the exit: the activity pool's threads are daemon
    threads, which the interpreter leaves behind (their leases lapse, and another worker runs
    them again).
    """
    code = _run_until_signalled(engine, stop_timeout)
    abandoned = _abandoned_attempts()
    if abandoned:
        progress(f"exiting with {abandoned} abandoned activity attempt(s) still running; their leases will lapse")
    return code


def _abandoned_attempts(grace: float = 0.5) -> int:
    # after the stop, the pool's idle threads leave at once; those still alive run abandoned attempts
    pool = [t for t in threading.enumerate() if t.name.startswith(ACTIVITY_THREADS + "_")]
    deadline = time.monotonic() + grace
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(thread.is_alive() for thread in pool)


def _run_until_signalled(engine: Engine, stop_timeout: float) -> int:
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():  # a second signal: the user does not want to wait
            progress(f"received {signal.Signals(signum).name} again: exiting without waiting for in-flight tasks")
            os._exit(130)
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    try:
        engine.start()
        progress(f"worker {engine.node_id} started ({describe(engine)})")
        progress("stop with Ctrl-C or SIGTERM")
        while not stop.wait(0.5):  # a timed wait, so the signal handler gets to run promptly
            pass
        progress(f"received {received[0]}: stopping (in-flight tasks may take up to {stop_timeout:g} s) ...")
        engine.stop(timeout=stop_timeout)
        progress(f"worker {engine.node_id} stopped")
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        engine.store.close()


@click.command(short_help="Run an engine defined in application code until SIGTERM or Ctrl-C.")
@click.argument("target", metavar="MODULE:ENGINE", type=TEXT)
@click.option(
    "--app-dir",
    default=".",
    show_default=True,
    type=TextPath(exists=True, file_okay=False),
    help="Directory put first on sys.path before importing MODULE.",
)
@click.option(
    "--stop-timeout",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds a graceful stop waits for in-flight tasks; activity attempts still running then are "
    "abandoned (retried elsewhere once their leases lapse).",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Level of the engine's log on stderr.",
)
def worker(target: str, app_dir: str, stop_timeout: float, log_level: str) -> int:
    """Run the dex.Engine named MODULE:ENGINE (e.g. myapp.workers:engine) until SIGTERM or Ctrl-C.

    The engine brings its own database connection (its adapter); --database-url and --schema
    do not apply.
    """
    engine = load_engine(target, app_dir)
    # after the import: logging the application configured itself is left alone
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_worker(engine, stop_timeout)
