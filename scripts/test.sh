#!/usr/bin/env bash
# Set up everything the tests need (a venv with the project and its test extras) and run them.
# PostgreSQL comes from DEX_TEST_DATABASE_URL, else testcontainers (when Docker answers), else
# the embedded server of the `pgserver` package. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m slow` for the long suites).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# exit code 5 (no tests collected) is non-zero and so fails this script, as it should
exec .venv/bin/python -m pytest -q "$@"
