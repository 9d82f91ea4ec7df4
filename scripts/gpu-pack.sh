#!/usr/bin/env bash
# scripts/gpu-pack.sh — pack what a bare GPU build box needs into one folder,
# .deps/gpu-carry/ (git-ignored), for scripts/build-cuda.sh to build from there
# with no network and no package manager:
#
#   llama.cpp/  the fetched llama.cpp source (.deps/llama.cpp), trimmed to what
#               libllama + ggml (CPU and CUDA backends) [+ libllama-common]
#               need to configure and build, plus the one vocab GGUF bench/gpu's
#               model takes its tokenizer from (ggml-vocab-llama-bpe, the
#               llama3 vocab) and models/templates/
#   sysroot/    Debian 12's runtime and -dev packages thaw links, each unpacked
#               with `dpkg -x` into this one tree: libmicrohttpd, jansson,
#               libsodium, xxhash, and libmicrohttpd's own needs (gnutls and its
#               libraries), so nothing of the build box's /usr is assumed
#
# Runs on the machine that has .deps/ (after scripts/setup.sh) and Debian's
# apt: `apt-get download` needs no root. Idempotent: the .debs are kept in
# .deps/gpu-debs/, and a second run only rebuilds the folder. Prints its size;
# the device tool carries at most 64 MiB with the working tree.
#
# usage: scripts/gpu-pack.sh [OUT_DIR]     default .deps/gpu-carry
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/.deps/llama.cpp"
out=${1:-$root/.deps/gpu-carry}
debs="$root/.deps/gpu-debs"
log() { printf '[gpu-pack] %s\n' "$*" >&2; }

[ -f "$src/CMakeLists.txt" ] || { echo "no llama.cpp source in $src: run scripts/setup.sh first" >&2; exit 1; }

# ---- 1. the trimmed llama.cpp source -------------------------------------------
# Kept: the top-level CMake files, cmake/, include/, src/ (libllama), ggml/ with
# only the CPU and CUDA backends (the others are add_subdirectory'd only when
# enabled), vendor/ (always add_subdirectory'd by the top-level CMakeLists),
# common/ (libllama-common, should thaw ever link it), tools/mtmd (thaw compiles
# libmtmd from it: images, issue #35; its test image kept, its audio and video
# samples dropped) and one vocab GGUF.
# Dropped: models/ but that vocab and templates/, the rest of tools/ (llama-server...),
# examples/, tests/, docs/, benches/, media/, conversion scripts, gguf-py/, .git/.
rm -rf "$out.tmp"
mkdir -p "$out.tmp/llama.cpp/models" "$out.tmp/llama.cpp/ggml/src"
(cd "$src" && cp -a CMakeLists.txt LICENSE cmake include src vendor common "$out.tmp/llama.cpp/")
[ -d "$src/licenses" ] && cp -a "$src/licenses" "$out.tmp/llama.cpp/"
mkdir -p "$out.tmp/llama.cpp/tools"
cp -a "$src/tools/mtmd" "$out.tmp/llama.cpp/tools/"
rm -f "$out.tmp/llama.cpp/tools/mtmd/test-2.mp3" "$out.tmp/llama.cpp/tools/mtmd/test-3.mp4"
(cd "$src/ggml" && cp -a CMakeLists.txt cmake include "$out.tmp/llama.cpp/ggml/")
(cd "$src/ggml/src" && for f in *; do
   case "$f" in
     ggml-cpu|ggml-cuda) cp -a "$f" "$out.tmp/llama.cpp/ggml/src/" ;;
     ggml-*) [ -d "$f" ] || cp -a "$f" "$out.tmp/llama.cpp/ggml/src/" ;;  # other backends' dirs: no
     *) cp -a "$f" "$out.tmp/llama.cpp/ggml/src/" ;;
   esac
 done)
cp -a "$src/models/ggml-vocab-llama-bpe.gguf" "$out.tmp/llama.cpp/models/"
# the real models' chat templates (0.6 MiB): mkmodel can take a family's own from there
[ -d "$src/models/templates" ] && cp -a "$src/models/templates" "$out.tmp/llama.cpp/models/"
# (the vendored header-only audio library, 4 MiB, stays: libmtmd's helper
# includes it, whatever thaw reads)

# ---- 2. the Debian packages, unpacked into one sysroot --------------------------
pkgs=(libmicrohttpd-dev libmicrohttpd12 libjansson-dev libjansson4 libsodium-dev libsodium23
      libxxhash-dev libxxhash0
      # libmicrohttpd12's run-time needs: a build box may lack them, and the
      # linker needs them to resolve libmicrohttpd.so's own references
      libgnutls30 libgmp10 libhogweed6 libnettle8 libidn2-0 libp11-kit0 libffi8 libtasn1-6 libunistring2)
mkdir -p "$debs"
need=()
for p in "${pkgs[@]}"; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get download ${need[*]}"
  (cd "$debs" && apt-get download -q "${need[@]}" >&2)
fi
mkdir -p "$out.tmp/sysroot"
for p in "${pkgs[@]}"; do
  deb=$(ls "$debs/${p}_"*.deb | sort -V | tail -1)
  dpkg -x "$deb" "$out.tmp/sysroot"
  echo "$(basename "$deb")" >>"$out.tmp/sysroot/PACKAGES"
done
# docs, man pages, static archives and .pc files (build-cuda.sh does not use
# pkg-config: their prefix=/usr would point at the build box's /usr)
rm -rf "$out.tmp/sysroot/usr/share" "$out.tmp/sysroot/usr/lib/x86_64-linux-gnu/pkgconfig"
find "$out.tmp/sysroot" -name '*.a' -delete

# a content stamp: scripts/build-cuda.sh copies the carried folder to a place
# of its own only when this changes (a carried copy may arrive with new
# mtimes on every call, which must not make ninja rebuild everything)
(cd "$out.tmp" && find . -type f ! -name STAMP -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-32) \
  >"$out.tmp/STAMP"
rm -rf "$out"
mv "$out.tmp" "$out"
log "$(du -sh "$out/llama.cpp" | cut -f1) llama.cpp source, $(du -sh "$out/sysroot" | cut -f1) sysroot"
size=$(du -sb "$out" | cut -f1)
log "$out: $((size / 1048576)) MiB ($size bytes)"
[ "$size" -lt $((60 * 1048576)) ] || { echo "carry folder over 60 MiB" >&2; exit 1; }
