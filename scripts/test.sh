#!/usr/bin/env bash
# Set up everything the tests need (a venv with the project and its test extras) and run them.
# PostgreSQL comes from DEX_TEST_DATABASE_URL, else testcontainers (when Docker answers), else
# the embedded server of the `pgserver` package. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m slow` for the long suites).
set -euo pipefail
cd "$(dirname "$0")/.."
# the dashboard's browser tests (tests/web/test_browser.py) need Chromium and its driver from
# the distribution; install them where they are missing and apt-get can (CI runs as root on
# Debian). Elsewhere those tests skip, saying why. apt-get's output goes to a log, shown only
# when the install fails.
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log="$(mktemp -t dex-apt-XXXXXX.log)"
    echo "installing chromium and chromium-driver for the browser tests (a few minutes; log in $log) ..." >&2
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >"$log" 2>&1; then
        rm -f "$log"
    else
        tail -n 5 "$log" >&2
        echo "could not install chromium (log in $log): the browser tests will be skipped" >&2
    fi
fi
# the Go worker SDK's tests (tests/remote/test_sdk_go.py) need Go: the same, with Debian's
# golang-go (the SDK uses only the standard library, so no module download follows)
if ! command -v go >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log="$(mktemp -t dex-apt-XXXXXX.log)"
    echo "installing golang-go for the Go SDK's tests (log in $log) ..." >&2
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go; } >"$log" 2>&1; then
        rm -f "$log"
    else
        tail -n 5 "$log" >&2
        echo "could not install golang-go (log in $log): the Go SDK's tests will be skipped" >&2
    fi
fi
echo "installing dex and its test extras into .venv ..." >&2
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# exit code 5 (no tests collected) is non-zero and so fails this script, as it should
# The suite mostly waits (leases, timeouts, subprocesses), so three pytest-xdist workers share
# the cores and one PostgreSQL server (tests/pg.py), each taking whole files (a file's tests
# run in order in one process, as without xdist); `-n 0` runs everything in this process.
# Progress is a count of tests done out of all ([1234/2863], pyproject's console_output_style).
exec .venv/bin/python -m pytest -q -n 3 --dist loadfile "$@"
