"""``python -m dex`` / ``dex``: the command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dex", description="dex, a durable execution engine")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run a durable order workflow and show its history")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dex.demo import run_demo

        return run_demo()
    parser.error(f"unknown command {args.command}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
