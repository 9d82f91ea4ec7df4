#!/usr/bin/env bash
# bench/gpu-run.sh — the one command for a bare GPU box (no network, no apt):
# build libllama/ggml with CUDA and thaw against them (scripts/build-cuda.sh,
# from the carried .deps/gpu-carry/), generate the model while CUDA compiles,
# then run bench/gpu, all inside one time budget; the table and the logs go
# to $OUT.
#
#   GPU_RUN_BUDGET   seconds for everything (default 570: a 600 s device call
#                    with room to spare)
#   GPU_RUN_LAYERS   the model's depth at 4096 wide (default: 32, the 8B
#                    shape, unless the disk is short; an existing model is kept)
#   OUT              where the logs and gpu-bench.md go (default .deps/gpu-out)
#
# Prepare on a machine with .deps/ (scripts/setup.sh) and Debian's apt:
#   scripts/gpu-pack.sh                    # .deps/gpu-carry/, ~30 MiB
# Then on the GPU box, from the repo root (carry: .deps/gpu-carry):
#   bench/gpu-run.sh
# Run again on the same (still warm) box, it skips what is built and
# generated (ninja is incremental; the model stays in .deps/gpu-models/) and
# the bench gets the whole budget: what the first run had to skip, it runs.
# bench/gpu's steps (8k, the copy rate, the seed workload, Claude Code's
# request shape, 32k, 128k) take about one warm call; the 128k history
# (~17 GB of KV: prefill twice, store, restore) runs last and may need the
# next, with ~36 GB of disk for the model and its blocks. bench/gpu builds
# bench/h2d.c (the plain copy rate) with the box's C compiler against the
# llama.cpp just built.
#
# Files in $OUT (at most 8): gpu-run.log (everything printed), gpu-bench.md
# (the table), servers.log (every thaw server's log), host-build.log,
# cuda-build.log, thaw-build.log, gen.log.
#
# usage: bench/gpu-run.sh [--cpu] [bench/gpu flags: --quick, --tokens A,B, ...]
#   --cpu   build without CUDA (scripts/build-cuda.sh --cpu): the same steps,
#           testable on a machine with no GPU
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
budget=${GPU_RUN_BUDGET:-570}
start=$(date +%s)
deadline=$((start + budget))
build_args=()
bench_args=()
for a in "$@"; do
  case "$a" in
    --cpu) build_args+=(--cpu) ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) bench_args+=("$a") ;;
  esac
done
suffix=$([ ${#build_args[@]} -gt 0 ] && echo -cpu || true)
layers_arg=()
[ -n "${GPU_RUN_LAYERS:-}" ] && layers_arg=(--layers "$GPU_RUN_LAYERS")
thaw="build-cuda$suffix/thaw"
out=${OUT:-$root/.deps/gpu-out}
mkdir -p "$out"
export OUT=$out
exec > >(tee -a "$out/gpu-run.log") 2>&1
say() { printf '[gpu-run %4ds] %s\n' $(($(date +%s) - start)) "$*"; }
collect() {  # the build logs, into $OUT
  local l=.deps/llama-cuda
  [ -f $l/host.build.log ] && cp $l/host.build.log "$out/host-build.log"
  [ -f $l/cuda.build.log ] && cp $l/cuda.build.log "$out/cuda-build.log"
  [ -f "build-cuda$suffix.build.log" ] && cp "build-cuda$suffix.build.log" "$out/thaw-build.log"
  return 0
}

# ---- 0. the machine ------------------------------------------------------------------
say "budget ${budget}s; $(nproc) CPUs; $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB RAM"}'); disk free here: $(df -h . | awk 'NR==2 {print $4}')"
command -v nvidia-smi >/dev/null 2>&1 \
  && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/  gpu: /'
for t in nvcc cmake ninja pkg-config python3 gcc g++; do
  p=$(command -v "$t" 2>/dev/null || { [ "$t" = nvcc ] && ls /usr/local/cuda/bin/nvcc 2>/dev/null; } || true)
  printf '  %-10s %s\n' "$t" "${p:-<none>}"
done
[ -d .deps/gpu-carry ] || say "no .deps/gpu-carry (scripts/gpu-pack.sh, and carry it): building from an earlier run's .deps/llama-cuda/stage, else .deps/llama.cpp and the system's packages"

# ---- 1. build, and generate the model as soon as thaw runs --------------------------
# the build may take the whole budget: what the bench then has no time for,
# bench/gpu skips, and the next run (at once, on the warm box) measures
build_budget=$((deadline - $(date +%s) - 15))
say "scripts/build-cuda.sh ${build_args[*]} (at most ${build_budget}s)"
t_build=$(date +%s)
rm -f "build-cuda$suffix/.thaw-ready"  # written again once this build's thaw links
timeout -k 10 "$build_budget" scripts/build-cuda.sh "${build_args[@]}" &
build_pid=$!
gen_pid=
while kill -0 "$build_pid" 2>/dev/null; do
  if [ -z "$gen_pid" ] && [ -f "build-cuda$suffix/.thaw-ready" ]; then
    say "thaw is built: generating the model while the rest compiles (log: gen.log)"
    PYTHONUNBUFFERED=1 python3 bench/gpu --thaw "$thaw" --generate-only "${layers_arg[@]}" \
      "${bench_args[@]}" >"$out/gen.log" 2>&1 &
    gen_pid=$!
  fi
  sleep 1
done
wait "$build_pid"
rc=$?
build_s=$(($(date +%s) - t_build))
collect
if [ $rc -ne 0 ]; then
  [ -n "$gen_pid" ] && kill "$gen_pid" 2>/dev/null
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "build not finished after ${build_s}s: run this same command again at once (while the machine is warm): ninja continues where it stopped"
  else
    say "build failed (exit $rc); logs in $out"
  fi
  exit 1
fi
say "build done in ${build_s}s"
if [ -n "$gen_pid" ]; then
  wait "$gen_pid" || { say "model generation failed:"; cat "$out/gen.log"; exit 1; }
  say "model: $(grep -E 'generated|already there' "$out/gen.log" | tail -1)"
fi

# ---- 2. bench ------------------------------------------------------------------------
left=$((deadline - $(date +%s)))
if [ "$left" -lt 30 ]; then
  say "no time left for the bench (${left}s): run this same command again at once, on the warm box"
  exit 1
fi
say "bench/gpu ${bench_args[*]} (at most ${left}s)"
cuda_arg=()
[ -z "$suffix" ] && cuda_arg=(--require-cuda)
PYTHONUNBUFFERED=1 timeout -k 10 "$left" python3 bench/gpu --thaw "$thaw" "${layers_arg[@]}" "${cuda_arg[@]}" \
  --deadline $((deadline - 10)) --server-log "$out/servers.log" \
  --note "build (scripts/build-cuda.sh ${build_args[*]}): ${build_s} s on $(nproc) CPUs, the model generated meanwhile" \
  "${bench_args[@]}"
rc=$?
say "bench/gpu exited $rc; total $(($(date +%s) - start))s; in $out: $(ls "$out" | tr '\n' ' ')"
exit $rc
