#!/usr/bin/env bash
# scripts/test.sh — set up, build and run every test: cmocka unit tests
# (ctest), end-to-end tests against the real build/thaw over HTTP (pytest),
# including the openai npm SDK compatibility test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
bash scripts/build.sh
echo "== unit tests"
ctest --test-dir build --output-on-failure
echo "== end-to-end tests"
# Debian's interpreter: it is the one python3-pytest and python3-requests install into
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" -m pytest -q tests/e2e "$@"
