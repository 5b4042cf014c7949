"""Run the benchmarks and print the figures: ``python -m benchmarks.run [--quick] [--only ...] [-n N]``.

Parts (``--only`` takes a comma-separated list; ``scale`` means waiting,chain,memory):

* ``throughput`` — dex: N workflows of three sequential activities, started with
  ``start_workflow`` and waited for with ``wait``; rate and database transactions per workflow.
* ``dbos``       — the same workflow on DBOS Transact (queue, worker_concurrency 64, 10 ms
  polling), in a subprocess; rate, transactions per workflow, and the dex/DBOS ratio.
* ``latency``    — one dex workflow alone, start to result, median of several.
* ``waiting``    — dex throughput with 10k and 100k runs waiting on a far timer and 100k
  finished runs in the tables, each next to batches on empty tables run just before and after.
* ``chain``      — one workflow of 10, 100 and 1000 sequential activities.
* ``memory``     — resident memory of a worker process holding 10k waiting runs.
* ``io``         — 3 × 20 ms of I/O per workflow: dex at 16 and 64 activity threads, and at 64
  with nothing chained (``chained_activity_seconds=0``), DBOS at 64 (``benchmarks.io_bound``).
* ``every``      — every activity a task of its own (``inline_activity_seconds=0``) vs DBOS.
* ``transactions`` — 3-step workflows of transaction steps, each inserting a row: dex
  ``@dex.transaction`` vs DBOS's transaction steps, dex before and after DBOS
  (``benchmarks.transactions``).

PostgreSQL: ``DEX_DATABASE_URL`` if set, else an embedded server (pgserver) in a temporary
directory. Each part uses a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import io_bound, pg
from benchmarks.common import (
    ROOT,
    cpu_busy,
    fmt,
    mb,
    ms,
    pct,
    run_child,
    say,
    settle,
    table,
    wait_until_idle,
)

PARTS = ("throughput", "dbos", "split", "latency", "waiting", "chain", "memory", "transactions", "io", "every")
ALIASES = {"scale": ("waiting", "chain", "memory"), "all": PARTS}


def profile(quick: bool) -> dict[str, Any]:
    """How big each part is: --quick finishes in a few minutes, the full run in under ~20."""
    if quick:
        return {
            "n": 300,
            "latency_samples": 11,
            "background": [(0, 0), (10_000, 0), (0, 10_000), (10_000, 10_000)],
            "background_n": 300,
            "chain": [10, 100, 1000],
            "memory_runs": 10_000,
            "timeout": 120,
        }
    return {
        "n": 2000,
        "latency_samples": 21,
        "background": [(0, 0), (10_000, 0), (100_000, 0), (0, 100_000), (100_000, 100_000)],
        "background_n": 1000,
        "chain": [10, 100, 1000],
        "memory_runs": 10_000,
        "timeout": 300,
    }


# -- parts ------------------------------------------------------------------------------------------
def part_throughput(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    from benchmarks import dex_bench

    r = dex_bench.throughput(dsn, cfg["n"], cfg["timeout"])
    r["engine_alone"] = dex_bench.engine_alone(dsn, cfg["n"], cfg["timeout"])
    results["throughput"] = r
    rows = [
        ["workflows", r["done"] if not r["timed_out"] else f"{r['done']} of {r['n']} (timed out)"],
        ["start to last result (s)", r["seconds"]],
        ["of which starting (s)", r["start_seconds"]],
        ["workflows/s", r["rate"]],
        ["transactions/workflow (server)", r["xacts_per_workflow"]],
        ["port calls/workflow (client)", r["port_calls_per_workflow"]],
        ["CPU ms/workflow, this process", r["client_cpu_seconds"] * 1000 / max(r["done"], 1)],
        [
            "CPU ms/workflow, PostgreSQL",
            ms(r["server_cpu_seconds"] / max(r["done"], 1)) if r.get("server_cpu_seconds") is not None else None,
        ],
        ["other processes' share of the CPU meanwhile", pct(r.get("other_cpu_share"))],
        ["engine alone: runs created first, start() → last result (workflows/s)", r["engine_alone"]["rate"]],
        ["starts alone: those runs created, no engine running (starts/s)", r["engine_alone"]["starts_rate"]],
    ]
    out = table("dex throughput (3 sequential activities)", ["", "dex"], rows)
    ports = sorted(r["port_calls"], key=lambda k: -r["port_seconds"][k])
    out += "\n" + table(
        "dex port calls during the batch (each is one transaction)",
        ["port method", "calls", "calls/workflow", "total s", "ms/call"],
        [
            [
                name,
                r["port_calls"][name],
                r["port_calls"][name] / max(r["done"], 1),
                r["port_seconds"][name],
                r["port_seconds"][name] * 1000 / r["port_calls"][name],
            ]
            for name in ports
        ],
    )
    return out


def part_dbos(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    try:
        import dbos  # noqa: F401
    except ImportError:
        results["dbos"] = {"skipped": True}
        return "DBOS Transact: skipped (pip install -e '.[bench]')\n"
    schema = pg.new_schema("bench_dbos")
    try:
        r = run_child(
            "benchmarks.dbos_bench",
            [
                "--schema",
                schema,
                "--runs",
                str(cfg["n"]),
                "--latency-samples",
                str(cfg["latency_samples"]),
                "--timeout",
                str(cfg["timeout"]),
            ],
            dsn,
            timeout=cfg["timeout"] + 120,
        )
        if r.get("skipped"):
            results["dbos"] = {"skipped": True}
            return "DBOS Transact: skipped (pip install -e '.[bench]')\n"
        after = pg.transactions(dsn)
    finally:
        pg.drop_schema(dsn, schema)
    r["xacts_server"] = after - r["xacts_before"]
    r["xacts_per_workflow"] = r["xacts_server"] / max(r["done"], 1)
    results["dbos"] = r
    tp = results.get("throughput")
    if tp:
        # the host's speed drifts within minutes: DBOS is compared with dex's batches just
        # before and just after it, not with one of them
        from benchmarks import dex_bench

        settle(cfg)
        again = dex_bench.throughput(dsn, cfg["n"], cfg["timeout"])
        results["throughput_after"] = again
        say(f"  dex again after DBOS: {again['rate']:.0f} workflows/s (before DBOS: {tp['rate']:.0f})")
    rows: list[list[Any]] = [
        ["workflows", r["done"]],
        ["start to last result (s)", r["seconds"]],
        ["of which enqueueing (s)", r["start_seconds"]],
        ["workflows/s", r["rate"]],
        ["transactions/workflow (server)", r["xacts_per_workflow"]],
        ["CPU ms/workflow, this process", r["client_cpu_seconds"] * 1000 / max(r["done"], 1)],
        [
            "CPU ms/workflow, PostgreSQL",
            ms(r["server_cpu_seconds"] / max(r["done"], 1)) if r.get("server_cpu_seconds") is not None else None,
        ],
        ["other processes' share of the CPU meanwhile", pct(r.get("other_cpu_share"))],
        ["idle latency, median (ms)", ms(r.get("latency_median"))],
    ]
    out = table("DBOS Transact 3-step workflow (queue, worker_concurrency 64, 10 ms polling)", ["", "DBOS"], rows)
    if tp:
        dex_cpu, dbos_cpu = _cpu_ms(tp), _cpu_ms(r)
        rate = mean_rate(results, ("throughput", "throughput_after"))
        out += "\n" + table(
            "dex vs DBOS, same machine, same PostgreSQL, same run (dex: the mean of its batches just before and"
            " just after DBOS's)",
            ["", "dex", "DBOS", "dex/DBOS"],
            [
                [
                    "workflows/s, dex before / after DBOS",
                    f"{tp['rate']:.0f} / {results['throughput_after']['rate']:.0f}",
                    None,
                    None,
                ],
                ["workflows/s", rate, r["rate"], ratio(rate, r["rate"])],
                # what no in-process batch of sequential starts can pass, whatever its engine does
                [
                    "starts alone, no engine running (starts/s)",
                    tp["engine_alone"]["starts_rate"],
                    None,
                    ratio(tp["engine_alone"]["starts_rate"], r["rate"]),
                ],
                [
                    "transactions/workflow",
                    tp["xacts_per_workflow"],
                    r["xacts_per_workflow"],
                    tp["xacts_per_workflow"] / r["xacts_per_workflow"],
                ],
                ["CPU ms/workflow (process + PostgreSQL)", dex_cpu, dbos_cpu, ratio(dex_cpu, dbos_cpu)],
            ],
        )
    return out


def part_split(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    """The same batch with the client and the worker in separate processes, dex and DBOS."""
    from benchmarks import dex_bench

    measured: dict[str, dict[str, Any]] = {}
    # dex, DBOS, dex again: DBOS is compared with the mean of the dex runs on either side of it
    for key, kind in (("dex", "dex"), ("dbos", "dbos"), ("dex_after", "dex")):
        if key == "dex_after" and measured["dbos"].get("skipped"):
            break
        if key != "dex":
            settle(cfg)
        with dex_bench.fresh_schema(dsn, f"bench_split_{kind}") as schema:
            args = [kind, "--schema", schema, "--runs", str(cfg["n"]), "--timeout", str(cfg["timeout"])]
            measured[key] = run_child("benchmarks.split", args, dsn, timeout=cfg["timeout"] + 180)
    results["split"] = measured
    dx, db = measured["dex"], measured["dbos"]

    def per(r: dict[str, Any], key: str) -> float | None:
        return ms(r[key] / max(r["done"], 1)) if not r.get("skipped") and r.get(key) is not None else None

    def column(r: dict[str, Any], key: str) -> Any:
        return None if r.get("skipped") else r[key]

    rows: list[list[Any]] = [
        ["workflows", column(dx, "done"), column(db, "done")],
        ["start to last result (s)", column(dx, "seconds"), column(db, "seconds")],
        ["of which starting / enqueueing (s)", column(dx, "start_seconds"), column(db, "start_seconds")],
        ["workflows/s", column(dx, "rate"), column(db, "rate")],
        ["CPU ms/workflow, client process", per(dx, "client_cpu_seconds"), per(db, "client_cpu_seconds")],
        ["CPU ms/workflow, worker process", per(dx, "worker_cpu_seconds"), per(db, "worker_cpu_seconds")],
        ["CPU ms/workflow, PostgreSQL", per(dx, "server_cpu_seconds"), per(db, "server_cpu_seconds")],
        ["other processes' share of the CPU meanwhile", pct(dx.get("other_cpu_share")), pct(db.get("other_cpu_share"))],
    ]
    if not db.get("skipped"):
        after = measured["dex_after"]["rate"]
        rows.append(["dex: workflows/s of the run after DBOS's", after, None])
        rate = mean_rate(measured, ("dex", "dex_after"))
        rows.append(["dex/DBOS (dex: the mean of the runs before and after)", rate / db["rate"], None])
    return table(
        "client and worker in separate processes (public client API; 3 sequential activities)",
        ["", "dex", "DBOS"],
        rows,
    )


def mean_rate(runs: dict[str, Any], keys: Sequence[str]) -> float:
    """dex's rate to set against DBOS's: the mean of its runs before and after DBOS's."""
    rates = [runs[key]["rate"] for key in keys if key in runs]
    return sum(rates) / len(rates)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cpu_ms(r: dict[str, Any]) -> float | None:
    if r.get("server_cpu_seconds") is None or r.get("client_cpu_seconds") is None:
        return None
    return (r["client_cpu_seconds"] + r["server_cpu_seconds"]) * 1000 / max(r["done"], 1)


def part_latency(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    from benchmarks import dex_bench

    r = dex_bench.latency(dsn, cfg["latency_samples"])
    results["latency"] = r
    rows: list[list[Any]] = [
        ["median (ms)", ms(r["median"])],
        ["p90 (ms)", ms(r["p90"])],
        ["min / max (ms)", f"{fmt(ms(r['min']))} / {fmt(ms(r['max']))}"],
        ["created_at → completed_at, median (ms)", ms(r["engine_median"])],
        ["other processes' share of the CPU meanwhile", pct(r.get("other_cpu_share"))],
    ]
    return table(
        f"dex idle latency: one 3-activity workflow alone, start → result ({r['samples']} samples)", ["", "dex"], rows
    )


def part_waiting(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    """Each state's batch between two batches on empty tables, its "vs empty" against their mean:
    the host's speed drifts by tens of percent within minutes, so only neighbours compare."""
    from benchmarks import dex_bench

    n, timeout = cfg["background_n"], cfg["timeout"]

    def empty() -> dict[str, Any]:
        r = dex_bench.with_background(dsn, 0, 0, n, timeout)
        say(f"  empty tables: {r['rate']:.1f} workflows/s")
        return r

    points: list[dict[str, Any]] = []
    empties: list[dict[str, Any]] = []
    for waiting, finished in cfg["background"]:
        if waiting == 0 and finished == 0:
            continue  # every other state brings its own batches on empty tables
        before = empty()
        r = dex_bench.with_background(dsn, waiting, finished, n, timeout)
        after = empty()
        empties += [before, after]
        r["empty_rates"] = [before["rate"], after["rate"]]
        r["vs_empty"] = r["rate"] / ((before["rate"] + after["rate"]) / 2)
        points.append(r)
        say(
            f"  waiting={waiting:,} finished={finished:,}: {r['rate']:.1f} workflows/s,"
            f" {r['vs_empty']:.2f} of its neighbours on empty tables (seeded in {r['seed_seconds']:.1f} s)"
        )
    results["waiting"] = points
    results["waiting_empty"] = empties
    rows: list[list[Any]] = []
    if empties:
        rates = [e["rate"] for e in empties]
        rows.append([0, 0, f"{min(rates):.0f}–{max(rates):.0f}", None, None, None, None])
    for p in points:
        rows.append(
            [
                p["waiting"],
                p["finished"],
                p["rate"] if not p["timed_out"] else f"{p['rate']:.1f} (timed out)",
                " / ".join(f"{rate:.0f}" for rate in p["empty_rates"]),
                p["vs_empty"],
                p["seed_seconds"],
                pct(p.get("other_cpu_share")),
            ]
        )
    return table(
        f"dex throughput with runs already in the tables ({n} 3-activity workflows each; each state's batch"
        " runs between two batches on empty tables, and is compared with their mean)",
        ["waiting runs", "finished runs", "workflows/s", "empty before / after", "vs empty", "seeding s", "other load"],
        rows,
    )


def part_chain(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    from benchmarks import dex_bench

    points = dex_bench.chains(dsn, cfg["chain"], timeout=cfg["timeout"] * 3)
    results["chain"] = points
    rows: list[list[Any]] = []
    previous: dict[str, Any] | None = None
    for p in points:
        growth: float | None = (
            p["seconds"] / previous["seconds"] if previous and p["seconds"] and previous["seconds"] else None
        )
        rows.append(
            [
                p["activities"],
                p["seconds"] if not p["timed_out"] else "timed out",
                p.get("ms_per_activity"),
                p.get("history_events"),
                growth,
                pct(p.get("other_cpu_share")),
            ]
        )
        previous = p
    return table(
        "dex: one workflow of n sequential activities, start → result (linear growth: ×10 per row)",
        ["activities", "seconds", "ms/activity", "history events", "× previous", "other load"],
        rows,
    )


def part_memory(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    schema = pg.new_schema("bench_mem")
    try:
        r = run_child(
            "benchmarks.memory_worker",
            ["--schema", schema, "--runs", str(cfg["memory_runs"]), "--timeout", str(cfg["timeout"] * 2)],
            dsn,
            timeout=cfg["timeout"] * 2 + 60,
        )
    finally:
        pg.drop_schema(dsn, schema)
    results["memory"] = r
    rows = [
        ["runs waiting on a timer", r["waiting"]],
        ["RSS after start, before the runs (MB)", mb(r["baseline_rss"])],
        ["RSS holding the waiting runs (MB)", mb(r["holding_rss"])],
        ["peak RSS (MB)", mb(r["peak_rss"])],
        ["time to drive them all to their timer (s)", r["drive_seconds"]],
    ]
    return table("dex worker memory (a subprocess that started the runs and drove them)", ["", "dex"], rows)


RUNNERS: dict[str, Callable[[str, dict[str, Any], dict[str, Any]], str]] = {
    "throughput": part_throughput,
    "dbos": part_dbos,
    "split": part_split,
    "latency": part_latency,
    "waiting": part_waiting,
    "chain": part_chain,
    "memory": part_memory,
    "transactions": lambda dsn, cfg, results: part_transactions(dsn, cfg, results),
    "io": lambda dsn, cfg, results: io_bound.part_io(dsn, cfg, results),
    "every": lambda dsn, cfg, results: io_bound.part_every(dsn, cfg, results),
}


def part_transactions(dsn: str, cfg: dict[str, Any], results: dict[str, Any]) -> str:
    """dex, DBOS, dex again (each in a process of its own): DBOS against the mean of dex's two."""
    from benchmarks import dex_bench

    measured: dict[str, dict[str, Any]] = {}
    for key, kind in (("dex", "dex"), ("dbos", "dbos"), ("dex_after", "dex")):
        if key == "dex_after" and measured["dbos"].get("skipped"):
            break
        if key != "dex":
            settle(cfg)
        with dex_bench.fresh_schema(dsn, f"bench_tx_{kind}") as schema:
            args = [kind, "--schema", schema, "--runs", str(cfg["n"]), "--timeout", str(cfg["timeout"])]
            measured[key] = run_child("benchmarks.transactions", args, dsn, timeout=cfg["timeout"] + 180)
            pg.drop_schema(dsn, f"{schema}_ds")  # DBOS's datasource schema
    results["transactions"] = measured
    dx, db = measured["dex"], measured["dbos"]
    if db.get("skipped"):
        return table("3 transaction steps, each inserting a row", ["", "dex"], [["workflows/s", dx["rate"]]])
    rate = mean_rate(measured, ("dex", "dex_after"))
    rows: list[list[Any]] = [
        ["workflows", dx["done"], db["done"], None],
        [
            "workflows/s (dex: before / after DBOS)",
            f"{dx['rate']:.0f} / {measured['dex_after']['rate']:.0f}",
            None,
            None,
        ],
        ["workflows/s", rate, db["rate"], ratio(rate, db["rate"])],
        ["transactions/workflow (server)", dx["xacts_per_workflow"], db["xacts_per_workflow"], None],
        ["rows written (3 per workflow, warm-up included)", dx["rows"], db["rows"], None],
    ]
    return table(
        "3 transaction steps, each inserting a row: dex @dex.transaction vs DBOS transaction steps (same run)",
        ["", "dex", "DBOS", "dex/DBOS"],
        rows,
    )


# -- targets ----------------------------------------------------------------------------------------
def targets(results: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []

    def row(name: str, wanted: str, got: str | None, ok: bool | None) -> None:
        rows.append(
            [
                name,
                wanted,
                got if got is not None else "not measured",
                "—" if ok is None else ("met" if ok else "NOT met"),
            ]
        )

    tp, db = results.get("throughput"), results.get("dbos")
    if tp and db and not db.get("skipped"):
        rate = mean_rate(results, ("throughput", "throughput_after"))
        times = rate / db["rate"]
        row(
            "3-activity rate vs DBOS",
            "≥ 10× DBOS",
            f"{times:.2f}× ({rate:.0f} vs {db['rate']:.0f}/s)",
            times >= 10,
        )
    else:
        row("3-activity rate vs DBOS", "≥ 10× DBOS", None, None)
    split = results.get("split")
    if split and not split["dbos"].get("skipped"):
        rate = mean_rate(split, ("dex", "dex_after"))
        times = rate / split["dbos"]["rate"]
        row(
            "  the same, client and worker processes",
            "≥ 10× DBOS",
            f"{times:.2f}× ({rate:.0f} vs {split['dbos']['rate']:.0f}/s)",
            times >= 10,
        )
    lat = results.get("latency")
    row(
        "idle latency, median",
        "≤ 50 ms",
        f"{lat['median'] * 1000:.1f} ms" if lat else None,
        lat["median"] <= 0.050 if lat else None,
    )
    points = results.get("waiting") or []
    heavy = max(points, key=lambda p: (p["waiting"], p["finished"]), default=None)
    if heavy is not None:
        share = heavy["vs_empty"]
        row(
            f"rate with {heavy['waiting']:,} waiting + {heavy['finished']:,} finished",
            "≥ 80% of empty",
            f"{share:.0%}",
            share >= 0.8 if heavy["waiting"] >= 100_000 and heavy["finished"] >= 100_000 else None,
        )
    else:
        row("rate with 100k waiting + 100k finished", "≥ 80% of empty", None, None)
    chain = {p["activities"]: p for p in results.get("chain") or []}
    if 100 in chain and 1000 in chain and chain[100]["seconds"] and chain[1000]["seconds"]:
        factor = chain[1000]["seconds"] / chain[100]["seconds"]
        row("1000 vs 100 activities", "≤ 12×", f"{factor:.1f}×", factor <= 12)
    else:
        row("1000 vs 100 activities", "≤ 12×", "timed out" if 1000 in chain else None, False if 1000 in chain else None)
    mem = results.get("memory")
    rss = mb(mem["holding_rss"]) if mem else None
    row(
        f"worker RSS with {mem['waiting']:,} waiting runs" if mem else "worker RSS with 10k waiting runs",
        "≤ 300 MB",
        f"{rss:.0f} MB" if rss is not None else None,
        rss <= 300 if rss is not None else None,
    )
    return rows


def machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "revision": revision(),
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def revision() -> str:
    """The dex commit measured (and whether dex/ had uncommitted changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dex"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in dex/" if dirty else "")


def parse_parts(text: str | None) -> list[str]:
    if not text:
        return list(PARTS)
    wanted: list[str] = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        names = ALIASES.get(item, (item,))
        for name in names:
            if name not in PARTS:
                raise SystemExit(f"unknown part {name!r}; choose from {', '.join(PARTS)} (or scale, all)")
            if name not in wanted:
                wanted.append(name)
    # dbos compares against the dex rate: run dex's throughput first when both are asked for
    return [p for p in PARTS if p in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes in all")
    parser.add_argument("--only", help="comma-separated parts: " + ", ".join(PARTS) + " (or scale, all)")
    parser.add_argument("-n", type=int, help="workflows in the throughput batches (dex and DBOS)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each part, wait up to this long for other processes to leave the CPU idle",
    )
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = profile(args.quick)
    if args.n:
        cfg["n"] = args.n
        cfg["background_n"] = min(cfg["background_n"], args.n)
    cfg["wait_idle"] = args.wait_idle
    parts = parse_parts(args.only)
    dsn, where = pg.server_dsn()
    info = machine()
    info.update(
        postgres=f"{pg.server_version(dsn)}, {where}",
        command=" ".join(["python -m benchmarks.run", *(sys.argv[1:] if argv is None else argv)]),
    )
    say(f"dex benchmarks — {info['date']} — {info['cores']} cores, {info['cpu']}, Python {info['python']}")
    say(f"PostgreSQL {info['postgres']}; dex at {info['revision']}")
    busy = cpu_busy()
    info["busy_before"] = busy
    say(f"parts: {', '.join(parts)}{' (quick)' if args.quick else ''}")
    if busy is not None:
        say(
            f"CPU busy with other work before starting: {busy:.0%}"
            + ("  (other processes compete for the cores: figures will be low)" if busy > 0.15 else "")
        )
    say("")
    results: dict[str, Any] = {"machine": info, "config": {k: v for k, v in cfg.items()}}
    outputs: list[str] = []
    begun = time.perf_counter()
    for part in parts:
        if args.wait_idle:
            results.setdefault("busy_before_part", {})[part] = wait_until_idle(args.wait_idle)
        say(f"-- {part} ...")
        t0 = time.perf_counter()
        try:
            text = RUNNERS[part](dsn, cfg, results)
        except Exception as exc:  # noqa: BLE001 - one broken part must not lose the others' figures
            text = f"{part}: FAILED: {type(exc).__name__}: {exc}\n"
            results.setdefault("errors", {})[part] = f"{type(exc).__name__}: {exc}"
        say(text)
        say(f"   ({part} took {time.perf_counter() - t0:.0f} s)\n")
        outputs.append(text)
    summary = table("targets (2-core machine)", ["target", "wanted", "measured", ""], targets(results))
    say(summary)
    say(f"total {time.perf_counter() - begun:.0f} s")
    results["seconds"] = time.perf_counter() - begun
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
