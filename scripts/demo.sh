#!/usr/bin/env bash
# scripts/demo.sh — thaw's main job, from a fresh clone: set up, build,
# generate a benchmark-shaped model, hold conversations, restart the server,
# continue them from the on-disk KV cache, and show what that saved.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
bash scripts/build.sh
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
exec "$PY" scripts/demo.py "$@"
