#!/usr/bin/env bash
# scripts/build.sh — configure and build thaw into build/ (build/thaw, unit tests).
# Warnings are errors when CI is set or THAW_WERROR=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
werror=${THAW_WERROR:-$([ -n "${CI:-}" ] && echo ON || echo OFF)}
cmake -S "$root" -B "$root/build" -DTHAW_WERROR="$werror" ${LLAMA_PREFIX:+-DLLAMA_PREFIX="$LLAMA_PREFIX"} >/dev/null
cmake --build "$root/build" -j"$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking)|Built target|Consolidate compiler' || true
test -x "$root/build/thaw" || { echo "build failed: build/thaw missing" >&2; exit 1; }
