#!/usr/bin/env bash
# Install dex into a local venv and run the demo: a durable order workflow.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[embedded]'
exec .venv/bin/dex demo "$@"
