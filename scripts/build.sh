#!/usr/bin/env bash
# scripts/build.sh — configure and build thaw into build/ (build/thaw, unit tests).
# Warnings are errors when CI is set or THAW_WERROR=ON. Exits with the build's
# own status: a failed rebuild must never leave the tests running against the
# previous binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
werror=${THAW_WERROR:-$([ -n "${CI:-}" ] && echo ON || echo OFF)}
cmake -S "$root" -B "$root/build" -DTHAW_WERROR="$werror" ${LLAMA_PREFIX:+-DLLAMA_PREFIX="$LLAMA_PREFIX"} >/dev/null
# the filter only hides progress lines; the status is cmake's, not grep's
set +e
cmake --build "$root/build" -j"$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking)|Built target|Consolidate compiler'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "build failed (cmake --build exited $status)" >&2
  exit "$status"
fi
test -x "$root/build/thaw" || { echo "build failed: build/thaw missing" >&2; exit 1; }
