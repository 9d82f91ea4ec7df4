#!/usr/bin/env bash
# scripts/build-cuda.sh — build libllama + ggml with CUDA from source, then thaw
# against them (LLAMA_PREFIX), on a bare GPU box: no network, no package
# manager, maybe no pkg-config.
#
# ggml is built with GGML_BACKEND_DL=ON, the layout of the npm build thaw
# uses by default: libggml/libllama hold no backend, each backend is a module
# thaw loads at start (ggml_backend_load_all_from_path(THAW_LLAMA_LIB_DIR)).
# So the build is two llama.cpp trees of the same source, run side by side:
#   host  GGML_CUDA=OFF: libggml-base, libggml, libllama [, libllama-common],
#         the CPU backend module (this CPU's ISA: AVX2, AVX512...; GGML_NATIVE
#         itself is refused with GGML_BACKEND_DL) — ~1 minute on 16 cores
#   cuda  GGML_CUDA=ON for one GPU architecture (CUDA_ARCH, default 90 =
#         Hopper: H100/H200): only the libggml-cuda module — the long part
# thaw is built as soon as the host tree is, and $BUILD/.thaw-ready is
# written then: `thaw mkmodel` works without the CUDA module, so a caller
# (bench/gpu-run.sh) can generate its model while CUDA still compiles.
#
# Steps (each timed): configure both trees, start the cuda build in the
# background, build the host tree, make an install-shaped LLAMA_PREFIX
# (include/ + lib/), configure and build thaw (with a sysroot: its
# libmicrohttpd/jansson/libsodium/xxhash come from there, no pkg-config),
# write env.sh / thaw.env, wait for the cuda module and add it to the prefix,
# check every library resolves.
#
# Idempotent: a second run re-runs each step incrementally (seconds). With
# --cpu the cuda tree is skipped: the same script, testable with no GPU.
#
# Where things come from (first that exists):
#   llama.cpp source  $LLAMA_SRC, .deps/gpu-carry/llama.cpp, .deps/llama.cpp
#   sysroot           $THAW_SYSROOT, .deps/gpu-carry/sysroot, none (the
#                     system's packages, found with pkg-config as usual)
# .deps/gpu-carry (scripts/gpu-pack.sh) is first copied to
# .deps/llama-cuda/stage/, again only when its STAMP changes: a carried folder
# may arrive with new mtimes on each call, and must not trigger a rebuild.
# Outputs (git-ignored):
#   .deps/llama-cuda/{host,cuda}/           the two build trees (+ *.log beside)
#   .deps/llama-cuda/prefix[-cpu]/          LLAMA_PREFIX: include/, lib/
#   build-cuda[-cpu]/thaw                   thaw; env.sh (to source) and
#                                           thaw.env (KEY=VALUE, for bench/gpu)
#
# usage: scripts/build-cuda.sh [--cpu] [-j N]
#   env: CUDA_ARCH (default 90), THAW_BUILD_DIR, LLAMA_SRC, THAW_SYSROOT
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kind=cuda
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) kind=cpu ;;
    -j) jobs=$2; shift ;;
    -j*) jobs=${1#-j} ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

now_ds() { local ns; ns=$(date +%s%N); echo $((ns / 100000000)); }  # tenths of a second
fmt_ds() { printf '%d.%d' $(($1 / 10)) $(($1 % 10)); }
t_start=$(now_ds)
t_step=$t_start
log() { printf '[build-cuda %6ss] %s\n' "$(fmt_ds $(($(now_ds) - t_start)))" "$*" >&2; }
step_done() {
  local now; now=$(now_ds)
  printf '[build-cuda] step %-32s %7s s\n' "$1" "$(fmt_ds $((now - t_step)))" >&2
  t_step=$now
}
first_dir() { for d in "$@"; do [ -n "$d" ] && [ -d "$d" ] && { echo "$d"; return; }; done; }
fail_log() { grep -E 'error|Error' "$1" | head -30 >&2; tail -20 "$1" >&2; echo "build-cuda: $2 failed: $1" >&2; exit 1; }

ldir="$root/.deps/llama-cuda"
mkdir -p "$ldir"
# the carried folder is copied to $ldir/stage once per content (its STAMP):
# a carry may arrive with fresh mtimes on each call, and the build trees must
# not see a changed source then
carry="$root/.deps/gpu-carry"
if [ -f "$carry/STAMP" ] && [ -z "${LLAMA_SRC:-}${THAW_SYSROOT:-}" ]; then
  if ! cmp -s "$carry/STAMP" "$ldir/stage/STAMP"; then
    log "staging $carry -> $ldir/stage"
    rm -rf "$ldir/stage" "$ldir/stage.tmp"
    cp -a "$carry" "$ldir/stage.tmp"
    mv "$ldir/stage.tmp" "$ldir/stage"
  fi
  carry="$ldir/stage"
elif [ -f "$ldir/stage/STAMP" ] && [ -z "${LLAMA_SRC:-}${THAW_SYSROOT:-}" ]; then
  carry="$ldir/stage"  # staged by an earlier run; this one carried nothing
fi
src=$(first_dir "${LLAMA_SRC:-}" "$carry/llama.cpp" "$root/.deps/llama.cpp")
[ -n "$src" ] && [ -f "$src/CMakeLists.txt" ] || { echo "no llama.cpp source (LLAMA_SRC, .deps/gpu-carry/llama.cpp or .deps/llama.cpp)" >&2; exit 1; }
sysroot=$(first_dir "${THAW_SYSROOT:-}" "$carry/sysroot")
suffix=$([ "$kind" = cpu ] && echo -cpu || true)
prefix="$ldir/prefix$suffix"
bdir=${THAW_BUILD_DIR:-$root/build-cuda$suffix}
mkdir -p "$bdir"
rm -f "$bdir/.thaw-ready"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
# thaw links llama.cpp's chat library when its CMakeLists says so
common=OFF
grep -q 'llama-common' "$root/CMakeLists.txt" && common=ON

log "kind=$kind jobs=$jobs source=$src sysroot=${sysroot:-<system>} llama-common=$common"

# ---- 1. configure both trees ----------------------------------------------------------
for t in host cuda; do  # a tree configured from another source path is started afresh
  c="$ldir/$t/CMakeCache.txt"
  if [ -f "$c" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$c"; then
    log "$t tree was configured from another source: starting it afresh"
    rm -rf "${ldir:?}/$t"
  fi
done
# GGML_NATIVE is refused with GGML_BACKEND_DL (the CPU module's load-time
# feature check needs the features named): name this machine's by hand
isa=()
if [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
  on() { if has "$@"; then echo ON; else echo OFF; fi; }
  isa=(-DGGML_SSE42="$(on sse4_2)" -DGGML_AVX="$(on avx)" -DGGML_AVX2="$(on avx2)" -DGGML_FMA="$(on fma)"
       -DGGML_F16C="$(on f16c)" -DGGML_BMI2="$(on bmi2)" -DGGML_AVX_VNNI="$(on avx_vnni)"
       -DGGML_AVX512="$(on avx512f avx512cd avx512vl avx512dq avx512bw)"
       -DGGML_AVX512_VBMI="$(on avx512vbmi)" -DGGML_AVX512_VNNI="$(on avx512_vnni)"
       -DGGML_AVX512_BF16="$(on avx512_bf16)")
fi
llama_flags=(-Wno-dev -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON
  -DGGML_NATIVE=OFF "${isa[@]}" -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
cmake -S "$src" -B "$ldir/host" "${gen[@]}" "${llama_flags[@]}" -DGGML_CUDA=OFF -DLLAMA_BUILD_COMMON=$common \
  >"$ldir/host.configure.log" 2>&1 || fail_log "$ldir/host.configure.log" "configure (host tree)"
if [ "$kind" = cuda ]; then
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
      [ -x "$d/nvcc" ] && { export PATH="$d:$PATH"; break; }
    done
  fi
  command -v nvcc >/dev/null 2>&1 || { echo "nvcc not found (PATH, /usr/local/cuda/bin); --cpu builds without CUDA" >&2; exit 1; }
  log "nvcc: $(nvcc --version | tail -1)"
  # Flash-attention kernels kept (GGML_CUDA_FA=ON, the default): llama.cpp
  # turns flash attention on by itself on this GPU, and without it the V cache
  # is stored transposed, which makes a state restore 32 layers x 1024 small
  # copies instead of 64 large ones. FA_ALL_QUANTS off (f16/q4_0/q8_0/bf16 vec
  # kernels only); NCCL is for several GPUs; no fatbin compression (a build
  # for this box only; "size" costs build time).
  cmake -S "$src" -B "$ldir/cuda" "${gen[@]}" "${llama_flags[@]}" -DLLAMA_BUILD_COMMON=OFF \
    -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_COMPRESSION_MODE=none \
    "-DCMAKE_CUDA_COMPILER=$(readlink -f "$(command -v nvcc)")" \
    >"$ldir/cuda.configure.log" 2>&1 || fail_log "$ldir/cuda.configure.log" "configure (cuda tree)"
fi
step_done "configure llama.cpp"

# ---- 2. the cuda module in the background, the host tree now ------------------------------
cuda_pid=
if [ "$kind" = cuda ]; then
  log "building ggml-cuda in the background (-j$jobs, sm_${CUDA_ARCH:-90}): .deps/llama-cuda/cuda.build.log"
  t_cuda=$(now_ds)
  cmake --build "$ldir/cuda" --target ggml-cuda -j "$jobs" >"$ldir/cuda.build.log" 2>&1 &
  cuda_pid=$!
  trap '[ -n "$cuda_pid" ] && kill "$cuda_pid" 2>/dev/null' EXIT
fi
targets=(llama ggml-cpu)
[ "$common" = ON ] && targets+=(llama-common)
log "building ${targets[*]} (-j$jobs)"
cmake --build "$ldir/host" --target "${targets[@]}" -j "$jobs" >"$ldir/host.build.log" 2>&1 \
  || fail_log "$ldir/host.build.log" "build (host tree)"
step_done "build ${targets[*]}"

# ---- 3. an install-shaped LLAMA_PREFIX ----------------------------------------------
# (headers copied with their mtimes: a re-run must not make thaw recompile)
rm -rf "$prefix/lib"
mkdir -p "$prefix/include" "$prefix/lib"
cp -p "$src"/include/*.h "$src"/ggml/include/*.h "$prefix/include/"
for f in "$ldir"/host/bin/*.so*; do
  ln -s "$f" "$prefix/lib/$(basename "$f")"
done
step_done "prefix"

# ---- 4. configure and build thaw ------------------------------------------------------
thaw_flags=(-DLLAMA_PREFIX="$prefix" -DLLAMA_SRC_DIR="$src")
libpath="$prefix/lib"
if [ -n "$sysroot" ]; then
  slib="$sysroot/usr/lib/x86_64-linux-gnu"
  # no pkg-config: CMakeLists.txt's fallback finds each header and library,
  # and CMAKE_{INCLUDE,LIBRARY}_PATH are searched before the system's
  thaw_flags+=(-DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
               -DCMAKE_INCLUDE_PATH="$sysroot/usr/include" -DCMAKE_LIBRARY_PATH="$slib"
               "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$slib")
  libpath="$libpath:$slib"
fi
rm -f "$bdir/CMakeCache.txt"  # the dependency paths must be looked up afresh
cmake -S "$root" -B "$bdir" "${gen[@]}" "${thaw_flags[@]}" >"$bdir.configure.log" 2>&1 \
  || fail_log "$bdir.configure.log" "configure (thaw)"
cmake --build "$bdir" --target thaw -j "$jobs" >"$bdir.build.log" 2>&1 || fail_log "$bdir.build.log" "build (thaw)"
step_done "configure + build thaw"

# the environment thaw runs with: env.sh to source, thaw.env (KEY=VALUE) for bench/gpu
write_env() {
  cat >"$bdir/env.sh" <<EOF
# source this to run $bdir/thaw (written by scripts/build-cuda.sh)
export LD_LIBRARY_PATH="$libpath\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export THAW_VOCAB_DIR="$src/models"
EOF
  printf 'LD_LIBRARY_PATH=%s\nTHAW_VOCAB_DIR=%s\n' "$libpath" "$src/models" >"$bdir/thaw.env"
}
write_env
deps=$(LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bdir/thaw")
if grep -q 'not found' <<<"$deps"; then
  echo "$deps" >&2
  echo "build-cuda: $bdir/thaw has unresolved libraries" >&2
  exit 1
fi
grep -E 'llama|ggml|microhttpd|jansson|sodium|xxhash|gnutls' <<<"$deps" | sed 's/^\s*/[build-cuda]   /' >&2
touch "$bdir/.thaw-ready"  # thaw runs now (CPU backend); mkmodel needs no more
log "thaw ready: $bdir/thaw"

# ---- 5. the cuda module -----------------------------------------------------------------
if [ -n "$cuda_pid" ]; then
  log "waiting for ggml-cuda"
  rc=0
  wait "$cuda_pid" || rc=$?
  cuda_pid=
  [ $rc -eq 0 ] || fail_log "$ldir/cuda.build.log" "build (ggml-cuda, exit $rc)"
  printf '[build-cuda] step %-32s %7s s (from its start)\n' "build ggml-cuda" "$(fmt_ds $(($(now_ds) - t_cuda)))" >&2
  t_step=$(now_ds)
  for f in "$ldir"/cuda/bin/libggml-cuda.so*; do
    ln -sf "$f" "$prefix/lib/$(basename "$f")"
  done
  [ -e "$prefix/lib/libggml-cuda.so" ] || { echo "build-cuda: no libggml-cuda.so was built" >&2; exit 1; }
  # libcuda.so.1 comes with the driver (absent on a build machine with no
  # GPU); where the loader does not find it, look in the driver's usual folders
  if LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$prefix/lib/libggml-cuda.so" \
       | grep -q 'libcuda.so.1 => not found'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
      if [ -e "$d/libcuda.so.1" ]; then
        log "libcuda.so.1 found in $d: added to the run-time library path"
        libpath="$libpath:$d"
        write_env
        break
      fi
    done
  fi
  LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$prefix/lib/libggml-cuda.so" \
    | grep -E 'not found|cuda|cublas|ggml' | sed 's/^\s*/[build-cuda]   /' >&2
fi
step_done "check"
log "done: $bdir/thaw (run with: . $bdir/env.sh)"
