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
#        .deps/llama/lib      prebuilt libllama + ggml (+ CPU variants), and
#                             the GPU backend modules: the folder thaw loads
#                             its backends from by default
#        .deps/llama/include  llama.h, ggml headers, gguf.h
#        .deps/llama.cpp      the matching source tree (vocab GGUFs, server
#                             source for bench/vs-llama-server)
#      With LLAMA_PREFIX=/path set, the build links that install instead
#      (the source tree is still fetched: tests need its vocab GGUFs).
#      The Vulkan backend always (libggml-vulkan.so of the same release,
#      @node-llama-cpp/linux-x64-vulkan, 27 MB): it runs on any Vulkan GPU,
#      and on Mesa's software device (lavapipe) it is what the tests' Vulkan
#      pass runs on. A module goes in only if its package's libggml-base.so
#      is byte for byte the one thaw links.
#   6. With --gpu cuda (CUDA 13: @node-llama-cpp/linux-x64-cuda, 143 MB) or
#      --gpu cuda12 (CUDA 12: the linux-x64-cuda-ext package, 177 MB), or
#      THAW_GPU=cuda|cuda12: the CUDA backend module too, then a check that
#      the CUDA runtime it needs is installed (libcudart, libcublas of that
#      major, the driver's libcuda.so.1); exits 1 naming what is missing.
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
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

gpu=${THAW_GPU:-}
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) [ $# -ge 2 ] || die "--gpu needs a value: cuda or cuda12"; gpu=$2; shift 2 ;;
    --gpu=*) gpu=${1#--gpu=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (usage: scripts/setup.sh [--gpu cuda|cuda12])" ;;
  esac
done
case $gpu in
  ''|vulkan) gpu= ;; # Vulkan comes always
  cuda|cuda12) ;;
  *) die "--gpu / THAW_GPU: '$gpu' is not cuda (CUDA 13) or cuda12 (CUDA 12); Vulkan is always set up" ;;
esac

# ---- 1. Debian packages -----------------------------------------------------
pkgs=(build-essential cmake pkg-config git ca-certificates curl nodejs npm
      libmicrohttpd-dev libjansson-dev libsodium-dev libxxhash-dev
      libcmocka-dev libcurl4-openssl-dev python3 python3-pytest python3-requests
      ceph-mon ceph-osd radosgw ceph-common haproxy chromium
      mesa-vulkan-drivers libvulkan1)
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

# ---- 2b. GPU backend modules -----------------------------------------------------
lib="$deps/llama/lib"

# gpu_module NAME PACKAGE MEMBER: puts the package's MEMBER (a path under
# package/bins/) into $lib as libggml-NAME.so unless its stamp says it is
# there. The package's libggml-base.so must be the one in $lib, byte for
# byte: a module built against another ggml would load and misbehave. A
# package without one of its own (CUDA 12's -ext, an extension of the
# CUDA 13 package of the same release) has its imports checked instead:
# every ggml symbol it takes from libggml-base.so must be defined there.
gpu_module() {
  local name=$1 pkg=$2 member=$3 file stamp tmp base
  file=libggml-${name%12}.so
  stamp="$lib/.gpu-$name-$NLC_VERSION"
  if [ -f "$stamp" ] && [ -f "$lib/$file" ]; then
    log "$name backend: present ($file in .deps/llama/lib)"
    return 0
  fi
  log "fetching the $name backend ($pkg@$NLC_VERSION) from the npm registry"
  tmp=$(mktemp -d "$deps/fetch.XXXXXX")
  (cd "$tmp" && npm pack --silent "$pkg@$NLC_VERSION" >/dev/null) || { rm -rf "$tmp"; die "npm pack $pkg@$NLC_VERSION failed"; }
  tar xzf "$tmp"/*.tgz -C "$tmp" --wildcards "package/bins/*/libggml-base.so" "package/bins/$member" 2>/dev/null ||
    tar xzf "$tmp"/*.tgz -C "$tmp" "package/bins/$member" || { rm -rf "$tmp"; die "$pkg has no bins/$member"; }
  base=$(find "$tmp/package/bins" -maxdepth 2 -name libggml-base.so | head -1)
  if [ -n "$base" ]; then
    cmp -s "$base" "$lib/libggml-base.so" || { rm -rf "$tmp"; die "$pkg@$NLC_VERSION's libggml-base.so differs from .deps/llama/lib's (the CPU package's): its $file would not match the ggml thaw links; not installed"; }
  else
    local missing
    missing=$(comm -23 <(nm -D --undefined-only "$tmp/package/bins/$member" | awk '$2 ~ /^(ggml|gguf)_/ {print $2}' | sort -u) \
                       <(nm -D --defined-only "$lib/libggml-base.so" | awk '{print $3}' | sort -u))
    [ -z "$missing" ] || { rm -rf "$tmp"; die "$pkg@$NLC_VERSION's $file needs ggml symbols .deps/llama/lib/libggml-base.so lacks: $(echo $missing | head -c 300); not installed"; }
  fi
  rm -f "$lib"/.gpu-"${name%12}"-* "$lib"/.gpu-"${name%12}"12-*  # cuda and cuda12 share libggml-cuda.so
  cp "$tmp/package/bins/$member" "$lib/.$file.tmp"
  mv -f "$lib/.$file.tmp" "$lib/$file"
  rm -rf "$tmp"
  touch "$stamp"
  log "$name backend ready: .deps/llama/lib/$file"
}
gpu_module vulkan @node-llama-cpp/linux-x64-vulkan linux-x64-vulkan/libggml-vulkan.so
[ -z "${LLAMA_PREFIX:-}" ] || log "note: a LLAMA_PREFIX build loads its own backends from $LLAMA_PREFIX, not these"

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
# ---- 6. the CUDA backend, when asked -------------------------------------------
# ldconfig's cache, then LD_LIBRARY_PATH: where the loader will look
have_lib() {
  local d
  "$(command -v ldconfig || echo /sbin/ldconfig)" -p 2>/dev/null | awk -v l="$1" '$1 == l {f = 1} END {exit !f}' && return 0
  for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do [ -e "$d/$1" ] && return 0; done
  return 1
}
if [ -n "$gpu" ]; then
  case $gpu in
    cuda) major=13; gpu_module cuda @node-llama-cpp/linux-x64-cuda linux-x64-cuda/libggml-cuda.so ;;
    cuda12) major=12; gpu_module cuda12 @node-llama-cpp/linux-x64-cuda-ext linux-x64-cuda/fallback/libggml-cuda.so ;;
  esac
  runtime=() driver=
  for l in libcudart.so.$major libcublas.so.$major; do have_lib "$l" || runtime+=("$l"); done
  have_lib libcuda.so.1 || driver=libcuda.so.1
  if [ ${#runtime[@]} -gt 0 ]; then
    other=$([ "$major" = 13 ] && echo "--gpu cuda12 for a CUDA 12 runtime" || echo "--gpu cuda for a CUDA 13 runtime")
    printf 'setup: the CUDA backend is in .deps/llama/lib, but the loader finds no %s.\n' "${runtime[*]}" >&2
    printf '  It needs the CUDA %s runtime: libcudart and libcublas (from NVIDIA'"'"'s CUDA repository, the\n' "$major" >&2
    printf '  cuda-cudart-%s-x and libcublas-%s-x packages, or the whole CUDA %s toolkit); then run\n' "$major" "$major" "$major" >&2
    printf '  ldconfig, or set LD_LIBRARY_PATH to their folder. Or run scripts/setup.sh %s.\n' "$other" >&2
  fi
  if [ -n "$driver" ]; then
    printf 'setup: no NVIDIA driver: the loader finds no libcuda.so.1 (install the NVIDIA driver for\n' >&2
    printf '  this GPU; in a container, the host'"'"'s driver libraries must be mounted in).\n' >&2
  fi
  if [ ${#runtime[@]} -gt 0 ] || [ -n "$driver" ]; then
    printf '  Until then thaw runs on the CPU, and says why at start-up.\n' >&2
    exit 1
  fi
  log "CUDA $major runtime: found (libcudart.so.$major, libcublas.so.$major, libcuda.so.1)"
fi
log "done"
