"""An embedded PostgreSQL server (the ``pgserver`` package) for development, tests and scripts.

The server keeps its data in a local directory (``.dex-data`` unless told otherwise), so a
second start finds the runs the first one left. Every process that asks for it holds it: it
stops when the last holder exits. ``dex dev`` is a holder that stays up until Ctrl-C, so
while one runs, :func:`embedded_dsn` in a test or a script reuses its server (and the server
outlives whichever of them exits first).

A holder killed outright (SIGKILL) cannot say it left; the next holder forgets processes that
no longer exist, so the server still stops when the last live holder exits.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import attrs

DEFAULT_DATA_DIR = Path(".dex-data")
_HOLDERS_FILE = ".handle_pids.json"  # pgserver's list of the processes that hold a server
MISSING_EXTRA = (
    "no database configured: set DEX_DATABASE_URL, or install the embedded server with "
    "pip install 'dex-engine[embedded]'"
)


@attrs.frozen
class EmbeddedServer:
    """A server this process holds: its DSN, where its data lives, and whether it was running
    already (another ``dex dev``, test or script started it)."""

    dsn: str
    data_dir: Path
    reused: bool


def embedded_dsn(data_dir: Path | str = DEFAULT_DATA_DIR) -> str:
    """The DSN of the embedded server whose data lives under ``data_dir``, started if it is not
    running (a running ``dex dev`` on that directory is reused). It stays up while this process
    runs, and after that while any other holder does.

    Raises RuntimeError when the ``embedded`` extra is not installed."""
    return hold_server(data_dir).dsn


def hold_server(data_dir: Path | str = DEFAULT_DATA_DIR) -> EmbeddedServer:
    """Start (or attach to) the embedded server under ``data_dir`` and hold it until this
    process exits; see :func:`embedded_dsn`."""
    pgserver = _pgserver()
    base = Path(data_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # run as root, pgserver starts the server as the system user "pgserver", which must be
        # able to write the data directory and its socket
        base.chmod(0o777)
    pgdata = base / "pg"
    reused = is_running(base)
    if pgdata.is_dir():
        _forget_dead_holders(pgdata)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return EmbeddedServer(dsn=str(server.get_uri()), data_dir=base, reused=reused)


def is_running(data_dir: Path | str = DEFAULT_DATA_DIR) -> bool:
    """Whether an embedded server runs on ``data_dir`` (by its ``postmaster.pid``)."""
    _pgserver()
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(Path(data_dir).resolve() / "pg")
    return info is not None and bool(info.is_running())


def _forget_dead_holders(pgdata: Path) -> None:
    # pgserver stops the server when the last process on its list exits; a process that was
    # killed never takes itself off, and the server would then outlive every real holder
    import fasteners  # type: ignore[import-untyped,unused-ignore]  # pgserver depends on it; it has no type information
    from pgserver.postgres_server import PostgresServer

    holders = pgdata / _HOLDERS_FILE
    with fasteners.InterProcessLock(PostgresServer.lock_path):  # the lock pgserver takes around that list
        try:
            pids = json.loads(holders.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(pids, list):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
        if alive != pids:
            holders.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    return True


def _pgserver() -> Any:
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise RuntimeError(MISSING_EXTRA) from exc
    return pgserver


def database_url(data_dir: Path | str = DEFAULT_DATA_DIR) -> str:
    """``DEX_DATABASE_URL`` when set, else an embedded server under ``data_dir``."""
    return os.environ.get("DEX_DATABASE_URL") or embedded_dsn(data_dir)
