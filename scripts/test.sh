#!/usr/bin/env bash
# scripts/test.sh — set up, build and run every test: cmocka unit tests
# (ctest), end-to-end tests against the real build/thaw over HTTP (pytest),
# including the openai npm SDK compatibility test and the chat page in
# headless Chromium (tests/e2e/test_webui.py), then the device path on
# Mesa's software Vulkan device (tests/e2e/test_vulkan.py).
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
THAW_TEST_VULKAN= "$PY" -m pytest -q tests/e2e "$@"
# The device path on Mesa's software Vulkan device (lavapipe, set up by
# scripts/setup.sh): tests/e2e/test_vulkan.py, skipped by the pass above so
# that it stays on the CPU. ggml skips a Vulkan device of CPU type unless
# GGML_VK_VISIBLE_DEVICES names it. THAW_TEST_VULKAN= (empty) skips the pass.
if [ -n "${THAW_TEST_VULKAN-1}" ] && [ $# -eq 0 ]; then
  echo "== end-to-end tests on the Vulkan device (lavapipe)"
  THAW_TEST_VULKAN=1 GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} "$PY" -m pytest -q tests/e2e/test_vulkan.py
fi
# A random-weight model's greedy output depends on the CPU variant ggml
# loads (AVX-512 vs AVX2 vs none): the suites whose assertions lean on
# sampled text run again under another variant, so a test that holds on one
# CPU only fails here first. THAW_TEST_VARIANT=haswell|sse42|... picks it,
# THAW_TEST_VARIANT= (empty) skips the pass.
variant=${THAW_TEST_VARIANT-x64}
if [ -n "$variant" ] && [ $# -eq 0 ]; then
  lib=$(find "$root/.deps/llama/lib" -maxdepth 1 -name "libggml-cpu-$variant.so" | head -1)
  [ -n "$lib" ] || { echo "no libggml-cpu-$variant.so in .deps/llama/lib" >&2; exit 1; }
  vdir=$(mktemp -d); trap 'rm -rf "$vdir"' EXIT
  ln -s "$lib" "$vdir/"
  echo "== end-to-end tests again under the $variant CPU variant"
  THAW_BACKEND_DIR=$vdir "$PY" -m pytest -q tests/e2e/test_agents.py tests/e2e/test_recurrent_cache.py
fi
