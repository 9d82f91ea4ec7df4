#!/usr/bin/env bash
# scripts/setup.sh — install everything thaw needs to build, test and run.
#
# Idempotent: each step checks before it acts, so a second run does nothing
# but print what is already there.
#
#   1. Debian packages (apt-get as root; otherwise print the one command),
#      including a single-node Ceph (ceph-mon ceph-osd radosgw ceph-common,
#      ~67 MB) that scripts/s3store.sh starts as the S3 store of the shared
#      tier's tests, and HAProxy (2.6 on Debian 12) that routes conversations
#      across replicas (deploy/haproxy.sh, tests/e2e/test_routing.py).
#   2. llama.cpp v0.4.0 from the npm registry into .deps/ (git-ignored):
#        .deps/llama/lib      prebuilt libllama + ggml (+ CPU variants)
#        .deps/llama/include  llama.h, ggml headers, gguf.h
#        .deps/llama.cpp      the matching source tree (vocab GGUFs, server
#                             source for bench/vs-llama-server)
#      With LLAMA_PREFIX=/path set, the build links that install instead
#      (the source tree is still fetched: tests need its vocab GGUFs).
#   3. The `openai` npm SDK for the compatibility test, into .deps/npm.
#   4. The coding agents' clients for their compatibility tests, pinned,
#      into .deps/agents: the @anthropic-ai/sdk, the Claude Code CLI
#      (@anthropic-ai/claude-code, its native binary from the package's
#      platform dependency) and the Codex CLI (@openai/codex, likewise).
#   5. The chat page's libraries (marked, DOMPurify, uPlot, highlight.js; the build embeds
#      them into the binary) and playwright-core (the browser tests drive
#      Debian's chromium with it), pinned, into .deps/webui.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
NLC_VERSION=3.21.1
log() { printf '[setup] %s\n' "$*"; }

# ---- 1. Debian packages -----------------------------------------------------
pkgs=(build-essential cmake pkg-config git ca-certificates curl nodejs npm
      libmicrohttpd-dev libjansson-dev libsodium-dev libxxhash-dev
      libcmocka-dev libcurl4-openssl-dev python3 python3-pytest python3-requests
      ceph-mon ceph-osd radosgw ceph-common haproxy chromium)
missing=()
for p in "${pkgs[@]}"; do
  if [ "$p" = nodejs ] || [ "$p" = npm ]; then
    command -v "${p/nodejs/node}" >/dev/null 2>&1 && continue
  fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "thaw needs these Debian packages; run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
else
  log "Debian packages: all present"
fi

# ---- 2. llama.cpp -------------------------------------------------------------
mkdir -p "$deps"
if [ -n "${LLAMA_PREFIX:-}" ]; then
  [ -f "$LLAMA_PREFIX/include/llama.h" ] || { echo "LLAMA_PREFIX=$LLAMA_PREFIX has no include/llama.h" >&2; exit 1; }
  ls "$LLAMA_PREFIX"/lib*/libllama.so* >/dev/null 2>&1 || { echo "LLAMA_PREFIX=$LLAMA_PREFIX has no lib/libllama.so" >&2; exit 1; }
  log "llama.cpp: using LLAMA_PREFIX=$LLAMA_PREFIX"
fi

stamp="$deps/llama/.complete-$NLC_VERSION"
if [ ! -f "$stamp" ]; then
  log "fetching llama.cpp v0.4.0 (node-llama-cpp $NLC_VERSION) from the npm registry"
  tmp=$(mktemp -d "$deps/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "@node-llama-cpp/linux-x64@$NLC_VERSION" "node-llama-cpp@$NLC_VERSION" >/dev/null)
  mkdir -p "$tmp/bin" "$tmp/src"
  tar xzf "$tmp"/node-llama-cpp-linux-x64-*.tgz -C "$tmp/bin"
  tar xzf "$tmp"/node-llama-cpp-"$NLC_VERSION".tgz -C "$tmp/src" package/llama/gitRelease.bundle
  rm -rf "$deps/llama" "$deps/llama.cpp"
  mkdir -p "$deps/llama/lib" "$deps/llama/include"
  cp "$tmp"/bin/package/bins/linux-x64/*.so "$deps/llama/lib/"
  (cd "$deps/llama/lib" && ln -sf libllama.v0.4.0.so libllama.so && ln -sf libggml.v0.4.0.so libggml.so)
  log "unpacking the llama.cpp source bundle"
  git clone -q "$tmp/src/package/llama/gitRelease.bundle" "$deps/llama.cpp" 2>/dev/null
  cp "$deps/llama.cpp/include/"*.h "$deps/llama.cpp/ggml/include/"*.h "$deps/llama/include/"
  rm -rf "$tmp"; trap - EXIT
  touch "$stamp"
  log "llama.cpp ready in .deps/llama"
else
  log "llama.cpp: already in .deps/llama"
fi

# ---- 3. openai npm SDK (compatibility test) ---------------------------------
if [ ! -f "$deps/npm/node_modules/openai/package.json" ]; then
  log "installing the openai npm SDK into .deps/npm"
  mkdir -p "$deps/npm"
  (cd "$deps/npm" && npm install --silent --no-audit --no-fund --prefix . openai@4 >/dev/null)
else
  log "openai npm SDK: present"
fi
# ---- 4. coding agents' clients (test_anthropic.py, test_responses.py) ------
agents_pkgs=(@anthropic-ai/sdk@0.71.2 @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0)
agents_stamp="$deps/agents/.complete-$(printf '%s_' "${agents_pkgs[@]}" | tr '@/' '-_')"
if [ ! -f "$agents_stamp" ]; then
  log "installing the coding agents' clients into .deps/agents: ${agents_pkgs[*]}"
  mkdir -p "$deps/agents"
  (cd "$deps/agents" && npm install --silent --no-audit --no-fund --save-exact --prefix . "${agents_pkgs[@]}" >/dev/null)
  # the wrapper's postinstall puts the platform's native binary in place;
  # an npm that holds install scripts back leaves that undone: run it
  cc="$deps/agents/node_modules/@anthropic-ai/claude-code"
  if ! "$cc/bin/claude.exe" --version >/dev/null 2>&1; then
    (cd "$cc" && node install.cjs >/dev/null)
  fi
  "$cc/bin/claude.exe" --version >/dev/null
  chome=$(mktemp -d)
  HOME="$chome" node "$deps/agents/node_modules/@openai/codex/bin/codex.js" --version >/dev/null 2>&1
  rm -rf "$chome"
  rm -f "$deps/agents"/.complete-*
  touch "$agents_stamp"
else
  log "coding agents' clients: present"
fi
# ---- 5. the chat page's libraries and the browser tests' driver --------------
webui_pkgs=(marked@18.2.1 dompurify@3.4.18 uplot@1.6.32 @highlightjs/cdn-assets@11.12.0 playwright-core@1.65.1)
webui_stamp="$deps/webui/.complete-$(printf '%s_' "${webui_pkgs[@]}" | tr '@/' '-_')"
if [ ! -f "$webui_stamp" ]; then
  log "installing the chat page's libraries into .deps/webui: ${webui_pkgs[*]}"
  mkdir -p "$deps/webui"
  (cd "$deps/webui" && npm install --silent --no-audit --no-fund --save-exact --prefix . "${webui_pkgs[@]}" >/dev/null)
  rm -f "$deps/webui"/.complete-*
  touch "$webui_stamp"
else
  log "chat page libraries: present"
fi
log "done"
