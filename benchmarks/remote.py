"""Activities/s through remote workers (docs/reference/contract.md §13): HTTP and gRPC against in-process, same run.

``PYTHONPATH=. python -m benchmarks.remote -n 300 [--workers 8]`` runs N workflows of three
sequential activities (``x+1``, ``x*2``, ``x-1``) three times, each on a fresh schema of the
same PostgreSQL (``DEX_DATABASE_URL``, else an embedded server):

* ``in-process``: the activities are Python functions the started engine registers;
* ``http``: the engine registers none; an :class:`ActivityTaskService` over it is served by
  uvicorn in the same process, and a worker process runs ``--workers`` threads, each one
  long-polling ``/v1/activity-tasks/poll`` (up to 8 tasks) and completing every task over one
  kept-alive HTTP connection;
* ``grpc``: the same worker process over ``serve_grpc`` and one channel.

Rate = 3N activities / (first start → last result); the runs are started one after the other
with ``start_workflow`` and waited for with ``wait``. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlparse

ADD, DOUBLE, SUB = "bench-remote-add", "bench-remote-double", "bench-remote-sub"
NAMES = [ADD, DOUBLE, SUB]


def _compute(name: str, x: int) -> int:
    return x + 1 if name == ADD else x * 2 if name == DOUBLE else x - 1


# -- the worker process --------------------------------------------------------------------------
def _http_worker(url: str, stop: threading.Event) -> None:
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname or "localhost", where.port, timeout=30)

    def post(path: str, body: dict[str, Any]) -> Any:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        return json.loads(response.read())

    while not stop.is_set():
        tasks = post("/v1/activity-tasks/poll", {"worker_id": "bench", "names": NAMES, "max": 8, "wait_seconds": 1})
        for task in tasks:
            result = _compute(task["name"], task["args"][0])
            post(
                f"/v1/activity-tasks/{task['task_id']}/complete",
                {"lease_version": task["lease_version"], "result": result},
            )


def _grpc_worker(target: str, stop: threading.Event) -> None:
    import grpc

    from dex.v1 import service_pb2 as pb
    from dex.v1 import service_pb2_grpc as pb_grpc

    stub = pb_grpc.ActivityTaskServiceStub(grpc.insecure_channel(target))
    while not stop.is_set():
        answer = stub.Poll(pb.PollRequest(worker_id="bench", names=NAMES, max=8, wait_seconds=1))
        for task in answer.tasks:
            result = _compute(task.name, json.loads(task.args_json)[0])
            stub.Complete(
                pb.CompleteRequest(task_id=task.task_id, lease_version=task.lease_version, result_json=str(result))
            )


def worker_main(kind: str, target: str, threads: int) -> None:
    """Run ``threads`` worker loops until stdin closes."""
    stop = threading.Event()
    loop = _http_worker if kind == "http" else _grpc_worker
    for _ in range(threads):
        threading.Thread(target=loop, args=(target, stop), daemon=True).start()
    sys.stdin.read()
    stop.set()


# -- the measuring process -----------------------------------------------------------------------
def measure(kind: str, dsn: str, runs: int, workers: int) -> dict[str, Any]:
    import dex
    from benchmarks import pg
    from dex.adapters.postgres import PostgresAdapter
    from dex.remote import ActivityTaskService

    @dex.activity(name=ADD)
    def add(x: int) -> int:
        return x + 1

    @dex.activity(name=DOUBLE)
    def double(x: int) -> int:
        return x * 2

    @dex.activity(name=SUB)
    def sub(x: int) -> int:
        return x - 1

    @dex.workflow(name="bench-remote-three")
    async def three(ctx: dex.WorkflowContext, x: int) -> int:
        for name in NAMES:
            x = await ctx.activity(name, x)
        return x

    schema = pg.new_schema("bench_remote")
    adapter = PostgresAdapter(dsn, schema=schema, max_connections=16)
    engine = dex.Engine(adapter, [three], [add, double, sub] if kind == "in-process" else [])
    worker: subprocess.Popen[str] | None = None
    server: Any = None
    try:
        engine.start()
        if kind != "in-process":
            service = ActivityTaskService(engine, poll_interval=0.5)
            target, server = _serve(kind, service)
            worker = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.remote", "worker", kind, target, str(workers)],
                stdin=subprocess.PIPE,
                text=True,
            )
        for run_id in [engine.start_workflow(three, i) for i in range(10)]:  # warm-up
            engine.wait(run_id, timeout=60)
        started = time.perf_counter()
        run_ids = [engine.start_workflow(three, i) for i in range(runs)]
        done = sum(engine.wait(r, timeout=300) == i * 2 + 1 for i, r in enumerate(run_ids))
        seconds = time.perf_counter() - started
    finally:
        if worker is not None:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(30)
        if server is not None:
            server.stop()
        engine.stop()
        adapter.close()
        pg.drop_schema(dsn, schema)
    return {"kind": kind, "runs": runs, "done": done, "seconds": seconds, "activities_per_s": 3 * done / seconds}


class _Uvicorn:
    def __init__(self, service: Any) -> None:
        import uvicorn
        from starlette.applications import Starlette

        from dex.remote.http_routes import activity_task_routes

        config = uvicorn.Config(Starlette(routes=activity_task_routes(service)), port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class _Grpc:
    def __init__(self, service: Any) -> None:
        from dex.remote.grpc_server import serve_grpc

        self.server = serve_grpc(service, "127.0.0.1", 0)
        self.port = self.server.port

    def stop(self) -> None:
        self.server.stop(1)


def _serve(kind: str, service: Any) -> tuple[str, Any]:
    if kind == "http":
        server: Any = _Uvicorn(service)
        return f"http://127.0.0.1:{server.port}", server
    server = _Grpc(service)
    return f"127.0.0.1:{server.port}", server


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=8, help="worker threads in the remote worker process")
    options = parser.parse_args()
    from benchmarks import pg

    dsn, where = pg.server_dsn()
    results = [measure(kind, dsn, options.runs, options.workers) for kind in ("in-process", "http", "grpc")]
    print(f"PostgreSQL: {where}; {options.runs} workflows x 3 activities each")
    for result in results:
        print(f"{result['kind']:>11}: {result['activities_per_s']:8.1f} activities/s ({result['seconds']:.2f} s)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
