"""``python -m dex`` / ``dex``: the command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dex", description="dex, a durable execution engine")
    parser.add_argument("--database-url", help="PostgreSQL DSN (default: $DEX_DATABASE_URL, else embedded)")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run (or resume) a durable order workflow and show its history")
    demo.add_argument("--schema", default="dex_demo", help="the schema the demo uses (default: dex_demo)")
    migrate = commands.add_parser("migrate", help="create or upgrade the dex schema")
    migrate.add_argument("--schema", default="dex", help="the schema to migrate (default: dex)")
    args = parser.parse_args(argv)

    from dex.adapters.postgres.embedded import database_url

    url = args.database_url or database_url()
    if args.command == "demo":
        from dex.demo import run_demo

        return run_demo(url, schema=args.schema)
    if args.command == "migrate":
        from dex.adapters.postgres import migrate as run_migrations

        version = run_migrations(url, args.schema)
        print(f"schema {args.schema!r} is at version {version}")
        return 0
    parser.error(f"unknown command {args.command}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
