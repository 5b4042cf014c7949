"""A dex activity worker that uses only the HTTP API (docs/reference/contract.md §13) and the standard library.

The same protocol as ``remote_worker.js``: long-poll for the activity names it knows, run each
task while a thread heartbeats (and notes ``cancel_requested``), report the result or the error.
A 409 means the lease is no longer ours: whatever we had is dropped.

    python examples/remote_worker.py --url http://127.0.0.1:8765 [--token T] [--worker-id ID]
        [--names resize-image,slow] [--max-tasks N]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.status = status


class Api:
    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"

    def post(self, path: str, body: dict[str, Any], timeout: float = 70) -> Any:
        data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            error = json.loads(exc.read() or b"{}").get("error", {})
            raise ApiError(exc.code, error.get("type", "?"), error.get("message", "")) from None


class Task:
    """A claimed task while it runs: its heartbeat thread, and whether it should stop."""

    def __init__(self, api: Api, claimed: dict[str, Any]) -> None:
        self.api, self.claimed = api, claimed
        self.path = f"/v1/activity-tasks/{claimed['task_id']}"
        self.cancelled = threading.Event()
        self._done = threading.Event()
        self._beat = threading.Thread(target=self._heartbeats, daemon=True)

    def _heartbeats(self) -> None:
        every = min(self.claimed["heartbeat_timeout"] / 3, 1.0)  # soon enough to learn of a cancellation
        while not self._done.wait(every):
            try:
                answer = self.api.post(f"{self.path}/heartbeat", {"lease_version": self.claimed["lease_version"]})
                if answer["cancel_requested"]:
                    self.cancelled.set()
            except ApiError as exc:
                if exc.status == 409:
                    self.cancelled.set()  # the lease is lost: our result would be refused
            except OSError:
                pass  # the server is unreachable for now: the next heartbeat tries again

    def run(self, handler: Callable[[list[Any], Task], Any]) -> str:
        self._beat.start()
        try:
            try:
                result = handler(self.claimed["args"], self)
            except Exception as exc:  # noqa: BLE001 - the activity's failure, reported to dex
                if self.cancelled.is_set():
                    return "cancelled"
                error = {
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "terminal": bool(getattr(exc, "terminal", False)),
                }
                self.api.post(f"{self.path}/fail", {"lease_version": self.claimed["lease_version"], "error": error})
                return "failed"
            if self.cancelled.is_set():
                return "cancelled"  # the run is over: nothing to report
            self.api.post(f"{self.path}/complete", {"lease_version": self.claimed["lease_version"], "result": result})
            return "completed"
        except ApiError as exc:
            if exc.status == 409:
                return "lost"  # another worker has it now, or the run ended
            raise
        finally:
            self._done.set()
            self._beat.join()


class Refused(Exception):
    def __init__(self, message: str, terminal: bool) -> None:
        super().__init__(message)
        self.terminal = terminal


def _slow(args: list[Any], task: Task) -> Any:
    until = time.monotonic() + args[0]
    while time.monotonic() < until:
        if task.cancelled.wait(0.05):
            return {"stopped": "cancelled"}
    return {"slept": args[0]}


def _refuse(args: list[Any], task: Task) -> Any:
    raise Refused(args[0], bool(args[1]) if len(args) > 1 else False)


HANDLERS: dict[str, Callable[[list[Any], Task], Any]] = {
    "resize-image": lambda args, task: {
        "name": args[0]["name"],
        "width": round(args[0]["width"] / 2),
        "height": round(args[0]["height"] / 2),
    },
    "slow": _slow,
    "refuse": _refuse,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--token")
    parser.add_argument("--worker-id", default=f"python-{os.getpid()}")
    parser.add_argument("--names", default=",".join(HANDLERS))
    parser.add_argument("--max-tasks", type=int, default=0, help="stop after this many tasks (0: never)")
    opts = parser.parse_args()
    api, names, done = Api(opts.url, opts.token), opts.names.split(","), 0
    print(f"worker {opts.worker_id} polling {opts.url} for {', '.join(names)}", flush=True)
    while opts.max_tasks == 0 or done < opts.max_tasks:
        try:
            tasks = api.post(
                "/v1/activity-tasks/poll", {"worker_id": opts.worker_id, "names": names, "max": 1, "wait_seconds": 1}
            )
        except (ApiError, OSError) as exc:
            print(f"poll: {exc}", flush=True)
            time.sleep(1)  # the server or its store is down: try again shortly
            continue
        for claimed in tasks:
            handler = HANDLERS[claimed["name"]]
            outcome = Task(api, claimed).run(handler)
            print(f"task {claimed['task_id']} {claimed['name']} attempt {claimed['attempt']}: {outcome}", flush=True)
            done += 1


if __name__ == "__main__":
    main()
