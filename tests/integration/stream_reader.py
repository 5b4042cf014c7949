"""A second process that reads a run's stream (tests/integration/test_stream_processes.py).

``python -m tests.integration.stream_reader DSN SCHEMA RUN_ID KEY`` prints ``ready``, then each
item as a JSON line as soon as it reads it, then ``end`` when the stream ends; its engine
registers no code: it only reads.
"""

from __future__ import annotations

import json
import sys

import dex
from dex.adapters.postgres import PostgresAdapter


def main() -> None:
    dsn, schema, run_id, key = sys.argv[1:5]
    adapter = PostgresAdapter(dsn, schema=schema, max_connections=2)
    engine = dex.Engine(adapter)
    try:
        reader = engine.read_stream(run_id, key, timeout=60)
        print("ready", flush=True)
        for item in reader:
            print(json.dumps(item), flush=True)
        print("end", flush=True)
    finally:
        adapter.close()


if __name__ == "__main__":
    main()
