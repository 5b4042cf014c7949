"""A remote activity worker woken by the Kafka dispatch mode's notices (docs/how-to/dispatch.md).

The worker of ``remote_worker.py`` long-polls the HTTP API; this one instead consumes the
activity topic of its queue (``<prefix>.activity.<queue>``) in a consumer group of its own and,
on each notice for a name it runs, claims through the API with ``wait_seconds: 0``. The notice is
only a wake-up: the claim, its lease, the heartbeats and the result all go through the API of
``remote_worker.py`` (its ``Api`` and ``Task`` are used as they are). A poll every
``--safety-seconds`` finds the tasks whose notice was lost.

    python examples/kafka_wakeup_worker.py --url http://127.0.0.1:8765 --bootstrap 127.0.0.1:9092
        --topic dex.activity.default [--group remote-workers] [--names resize-image] [--max-tasks N]

Needs confluent-kafka (``pip install "dex-engine[kafka]"``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remote_worker import HANDLERS, Api, ApiError, Task


def notice_name(value: bytes | None) -> str | None:
    """The activity name a notice is for, or None if the message is not a notice."""
    try:
        notice = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(notice, dict) or notice.get("v") != 1 or notice.get("kind") != "activity":
        return None
    name = notice.get("name")
    return name if isinstance(name, str) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--token")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="dex-remote-workers")
    parser.add_argument("--worker-id", default=f"kafka-python-{os.getpid()}")
    parser.add_argument("--names", default=",".join(HANDLERS))
    parser.add_argument("--safety-seconds", type=float, default=30.0)
    parser.add_argument("--max-tasks", type=int, default=0, help="stop after this many tasks (0: never)")
    opts = parser.parse_args()
    api, names, done = Api(opts.url, opts.token), opts.names.split(","), 0
    consumer = Consumer(
        {
            "bootstrap.servers": opts.bootstrap,
            "group.id": opts.group,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([opts.topic])
    print(f"worker {opts.worker_id} woken by {opts.topic} for {', '.join(names)}", flush=True)
    polled_at = time.monotonic()
    try:
        while opts.max_tasks == 0 or done < opts.max_tasks:
            message = consumer.poll(0.5)
            woken = message is not None and message.error() is None and notice_name(message.value()) in names
            if not woken and time.monotonic() - polled_at < opts.safety_seconds:
                continue
            polled_at = time.monotonic()
            try:
                tasks = api.post(
                    "/v1/activity-tasks/poll",
                    {"worker_id": opts.worker_id, "names": names, "max": 4, "wait_seconds": 0},
                )
            except (ApiError, OSError) as exc:
                print(f"poll: {exc}", flush=True)
                continue
            for claimed in tasks:
                outcome = Task(api, claimed).run(HANDLERS[claimed["name"]])
                print(
                    f"task {claimed['task_id']} {claimed['name']} attempt {claimed['attempt']}: {outcome}", flush=True
                )
                done += 1
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
