"""What ``benchmarks.run`` and its parts in other modules share: tables in Markdown, child
processes that print one JSON line, and waiting for the machine to go idle between runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# -- formatting ---------------------------------------------------------------------------------
def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [title, ""]
    lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        lines.append(
            "| "
            + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            + " |"
        )
    return "\n".join(lines) + "\n"


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def mb(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def pct(share: float | None) -> str | None:
    return None if share is None else f"{share:.0%}"


def say(text: str) -> None:
    print(text, flush=True)


def child_env(dsn: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DEX_BENCH_DSN"] = dsn
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_child(module: str, args: list[str], dsn: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` and return the JSON object on its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=child_env(dsn),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{module} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def cpu_busy(seconds: float = 2.0) -> float | None:
    """Share of the machine's CPU time that was busy over ``seconds`` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_until_idle(limit: float, threshold: float = 0.15) -> float | None:
    """Wait (at most ``limit`` seconds) until other processes leave the CPU mostly idle."""
    deadline = time.monotonic() + limit
    busy = cpu_busy()
    while busy is not None and busy > threshold and time.monotonic() < deadline:
        say(f"   the machine is {busy:.0%} busy with other work; waiting for it to calm down ...")
        time.sleep(5)
        busy = cpu_busy()
    return busy


def settle(cfg: dict[str, Any]) -> None:
    """Between the runs of one comparison, as before each part: with ``--wait-idle``, wait for
    the machine to be idle again. The server works on after a run (autovacuum of the tables it
    filled, the checkpoint, the dropped schema's files), and the run after it would pay for it."""
    if cfg.get("wait_idle"):
        wait_until_idle(cfg["wait_idle"])
