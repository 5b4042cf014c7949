#!/usr/bin/env bash
# Set up everything the tests need (a venv with the project and its test extras) and run them.
# PostgreSQL comes from DEX_TEST_DATABASE_URL, else testcontainers (when Docker answers), else
# the embedded server of the `pgserver` package. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m slow` for the long suites).
set -euo pipefail
cd "$(dirname "$0")/.."
# the dashboard's browser tests (tests/web/test_browser.py) need Chromium and its driver from
# the distribution; install them where they are missing and apt-get can (CI runs as root on
# Debian). Elsewhere those tests skip, saying why.
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing chromium and chromium-driver for the browser tests ..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
        || echo "could not install chromium: the browser tests will be skipped" >&2
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# exit code 5 (no tests collected) is non-zero and so fails this script, as it should
# The suite mostly waits (leases, timeouts, subprocesses), so three pytest-xdist workers share
# the cores and one PostgreSQL server (tests/pg.py), each taking whole files (a file's tests
# run in order in one process, as without xdist); `-n 0` runs everything in this process.
exec .venv/bin/python -m pytest -q -n 3 --dist loadfile "$@"
