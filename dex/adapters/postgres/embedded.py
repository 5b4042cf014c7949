"""An embedded PostgreSQL server (the ``pgserver`` package) for the demo and for trying dex out.

The server keeps its data in a local directory, so a second start finds the runs the first
one left; it stops when the process exits.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

DEFAULT_DATA_DIR = Path(".dex-data")


def embedded_dsn(data_dir: Path | str = DEFAULT_DATA_DIR) -> str:
    """Start (or attach to) an embedded server whose data lives under ``data_dir``; return its DSN."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise RuntimeError(
            "no database configured: set DEX_DATABASE_URL, or install the embedded server with "
            "pip install 'dex-engine[embedded]'"
        ) from exc
    base = Path(data_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # run as root, pgserver starts the server as the system user "pgserver", which must be
        # able to write the data directory and its socket
        base.chmod(0o777)
    server = pgserver.get_server(base / "pg", cleanup_mode="stop")  # type: ignore[attr-defined]
    return str(server.get_uri())


def database_url(data_dir: Path | str = DEFAULT_DATA_DIR) -> str:
    """``DEX_DATABASE_URL`` when set, else an embedded server under ``data_dir``."""
    return os.environ.get("DEX_DATABASE_URL") or embedded_dsn(data_dir)
