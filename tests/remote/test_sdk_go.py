"""The Go worker SDK (clients/go) against a real dex web: its ``go test`` suite runs with the
app's URL and token in the environment (DEX_URL, DEX_TOKEN) and drives runs over the JSON API;
here each run it reports is checked against the engine. Skipped only where ``go`` is missing
(scripts/test.sh installs it where apt-get can)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.remote.sdk_support import TOKEN, check_reported_runs, served_for_sdk

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "go"
GO = shutil.which("go")

pytestmark = pytest.mark.skipif(GO is None, reason="go is not installed (apt-get install golang-go)")

# every test of the suite, each of which must pass (a skip would mean the URL did not get there)
TESTS = {
    "TestCompletesActivitiesWithTheirArguments",
    "TestAWrongTokenEndsRunWithAnError",
    "TestNamesDexWouldRefuseAreRefusedAtRegister",
    "TestAtMostConcurrencyTasksRunAtOnce",
    "TestHeartbeatsKeepATaskLongerThanItsLease",
    "TestCancellingTheRunCancelsTheActivitysContext",
    "TestTerminalRetriedAndRetryAfterErrors",
    "TestPoisonAffectsOnlyItsOwnRun",
    "TestAResultThatIsNotUTF8IsSentAsReplacementCharacters",
    "TestRunDrainsTheTasksItRunsBeforeReturning",
    "TestSIGTERMStopsPollingAndFinishesTheTaskInFlight",
    "TestFailedCallsAreRetriedWithBackoffAndTheWorkerRecovers",
    "TestAPollCutOffByTheDrainEndsRunAtOnce",
}


def test_the_go_sdk_suite_passes_against_a_real_dex_web(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert GO is not None
    # the module uses nothing outside the standard library: no proxy, no network
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    if "GOCACHE" not in env and not os.access(Path.home(), os.W_OK):  # else go's own cache, kept between runs
        env["GOCACHE"] = str(tmp_path_factory.getbasetemp() / "go-build")
    with served_for_sdk() as (engine, url):
        env.update(DEX_URL=url, DEX_TOKEN=TOKEN)
        done = subprocess.run(
            [GO, "test", "-count=1", "-v", "-timeout", "180s", "./..."],
            cwd=CLIENT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        assert set(re.findall(r"^--- PASS: (\w+)", output, re.MULTILINE)) == TESTS, output[-6000:]
        assert "--- SKIP" not in output, output[-6000:]
        ended = check_reported_runs(engine, output, at_least=20)
        statuses = Counter(engine.get_run(run_id).status.value for run_id in ended)
        assert statuses == {"COMPLETED": 13, "FAILED": 8, "CANCELLED": 1}, statuses
        # nothing left behind: every run the suite started ended (none waits on a lost task)
        runs = engine.list_runs(limit=1000)
        assert len(runs) == len(ended), [(info.run_id, info.status) for info in runs if info.run_id not in ended]
