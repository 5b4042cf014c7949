"""The Java worker SDK (clients/java) against a real dex web: compiled with ``javac`` once per
session into a temporary directory, its test main (a runner of its own, no JUnit) runs with the
app's URL and token in the environment (DEX_URL, DEX_TOKEN) and drives runs over the JSON API;
here each run it reports is checked against the engine. Skipped only where ``javac`` or
``java`` is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.remote.sdk_support import TOKEN, check_reported_runs, served_for_sdk

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "java"
JAVAC, JAVA = shutil.which("javac"), shutil.which("java")

pytestmark = pytest.mark.skipif(
    JAVAC is None or JAVA is None, reason="javac or java is not installed (a JDK 17 is needed)"
)

# every test of the runner, each of which must pass
TESTS = {
    "jsonRoundTripsWhatJavaHolds",
    "jsonRefusesWhatIsNotStrictJson",
    "completesActivitiesWithTheirArguments",
    "aWrongTokenEndsRunWithAnError",
    "namesDexWouldRefuseAreRefusedAtRegister",
    "atMostConcurrencyTasksRunAtOnce",
    "heartbeatsKeepATaskLongerThanItsLease",
    "cancellingTheRunInterruptsTheActivity",
    "terminalRetriedAndRetryAfterErrors",
    "poisonAffectsOnlyItsOwnRun",
    "stopDrainsTheTasksRunningBeforeRunReturns",
    "aPollCutOffByStopEndsRunAtOnce",
    "failedCallsAreRetriedWithBackoffAndTheWorkerRecovers",
    "sigtermDrainsTheTaskInFlightBeforeTheJvmExits",
}


@pytest.fixture(scope="session")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SDK and its tests compiled (warnings are errors), once per session."""
    assert JAVAC is not None
    classes = tmp_path_factory.mktemp("java-classes")
    sources = sorted(str(path) for path in CLIENT.glob("*/**/*.java"))
    done = subprocess.run(
        [JAVAC, "--release", "17", "-Xlint:all", "-Werror", "-d", str(classes), *sources],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return classes


def test_the_java_sdk_suite_passes_against_a_real_dex_web(java_classes: Path) -> None:
    assert JAVA is not None
    with served_for_sdk() as (engine, url):
        done = subprocess.run(
            [JAVA, "-cp", str(java_classes), "dex.worker.TestMain"],
            env={**os.environ, "DEX_URL": url, "DEX_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        assert set(re.findall(r"^PASS (\w+)$", output, re.MULTILINE)) == TESTS, output[-6000:]
        ended = check_reported_runs(engine, output, at_least=20)
        statuses = Counter(engine.get_run(run_id).status.value for run_id in ended)
        assert statuses == {"COMPLETED": 12, "FAILED": 8, "CANCELLED": 1}, statuses
        # nothing left behind: every run the suite started ended (none waits on a lost task)
        runs = engine.list_runs(limit=1000)
        assert len(runs) == len(ended), [(info.run_id, info.status) for info in runs if info.run_id not in ended]
