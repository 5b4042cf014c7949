"""Remote workers woken by the Kafka mode's notices: ``examples/kafka_wakeup_worker.py`` (Python,
confluent-kafka) and ``examples/kafka_wakeup_worker.js`` (Node, kafkajs: run only when
``npm install kafkajs`` works here), against a real broker, PostgreSQL and the HTTP API.

Each worker's safety poll is 60 s, so a run done within seconds was woken by notices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.remote import ActivityTaskService
from tests.kafka_broker import Broker, tansu_binary
from tests.pg import fresh_schema
from tests.remote.support import WORKFLOWS, http_server, resize

pytestmark = pytest.mark.postgres
pytest.importorskip("confluent_kafka", reason="the kafka extra (confluent-kafka) is not installed")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IMAGES = [{"name": f"img{i}.png", "width": 100 * i, "height": 50 * i} for i in range(1, 4)]
HALVED = [{"name": f"img{i}.png", "width": 50 * i, "height": 25 * i} for i in range(1, 4)]


@pytest.fixture
def served(pg_dsn: str) -> Iterator[tuple[dex.Engine, str, str, str]]:
    """A started Kafka-mode engine (the workflows only, so it leads and relays), its HTTP API,
    the broker's address and the activity topic of the default queue."""
    binary, why = tansu_binary()
    if binary is None:
        pytest.skip(why)
    broker = Broker(binary)
    broker.start()
    with fresh_schema(pg_dsn) as schema:
        adapter = PostgresAdapter(pg_dsn, schema=schema, max_connections=4)
        engine = dex.Engine(
            adapter, workflows=WORKFLOWS, dispatch="kafka", kafka={"bootstrap.servers": broker.bootstrap}
        )
        from dex.adapters.kafka.settings import kafka_settings

        topic = kafka_settings({"bootstrap.servers": broker.bootstrap}, schema).topic("activity", "default")
        try:
            with engine, http_server(ActivityTaskService(engine, poll_interval=0.5)) as url:
                yield engine, url, broker.bootstrap, topic
        finally:
            adapter.close()
            broker.stop()


def _run(command: list[str], engine: dex.Engine, env: dict[str, str] | None = None) -> str:
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        run_id = engine.start_workflow(resize, IMAGES)
        assert engine.wait(run_id, timeout=40) == HALVED
        output, _ = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 0, output
    assert output.count(": completed") == 3, output
    return output


def test_the_python_worker_is_woken_by_notices(served: tuple[dex.Engine, str, str, str]) -> None:
    engine, url, bootstrap, topic = served
    script = str(EXAMPLES / "kafka_wakeup_worker.py")
    _run(
        [
            sys.executable,
            script,
            "--url",
            url,
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--names",
            "resize-image",
            "--safety-seconds",
            "60",
            "--max-tasks",
            "3",
        ],
        engine,
    )


@pytest.fixture(scope="module")
def kafkajs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node or npm is not installed")
    where = tmp_path_factory.mktemp("kafkajs")
    try:
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(where), "kafkajs@2"],
            check=True,
            capture_output=True,
            timeout=120,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"kafkajs does not install from npm here: {exc}")
    return where / "node_modules"


def test_the_node_worker_is_woken_by_notices(served: tuple[dex.Engine, str, str, str], kafkajs: Path) -> None:
    engine, url, bootstrap, topic = served
    node = shutil.which("node")
    assert node is not None
    _run(
        [
            node,
            str(EXAMPLES / "kafka_wakeup_worker.js"),
            "--url",
            url,
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--safety-seconds",
            "60",
            "--max-tasks",
            "3",
        ],
        engine,
        env={**os.environ, "NODE_PATH": str(kafkajs)},
    )
