#!/usr/bin/env bash
# scripts/fuzz.sh — build thaw's libFuzzer targets and fuzz each one for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   fuzz every tests/fuzz/fuzz_*.c (default 60 s each)
#   scripts/fuzz.sh --regen-seeds          rewrite the generated binary seeds in
#                                          tests/fuzz/corpus/ (after a format change) and exit
#   scripts/fuzz.sh --coverage             no fuzzing: replay each target's corpus in a
#                                          source-coverage build (build-fuzz/cov/) and print
#                                          per-function line/branch coverage of its module
#   FUZZ_TARGETS="fuzz_idx fuzz_kvstate" scripts/fuzz.sh 600   only those targets
#   FUZZ_KEEP_GOING=1 scripts/fuzz.sh      don't stop a target at its first crash (libFuzzer
#                                          -fork=1 -ignore_crashes=1): every reproducer of the
#                                          run is kept, for a known bug that is not fixed yet
#
# Needs what scripts/setup.sh installs (cmake, the libraries, .deps/llama), plus:
#   1. clang with libFuzzer. A `clang` (or $CC) that links -fsanitize=fuzzer is
#      used as it is; otherwise Debian 12's clang-14 and libclang-rt-14-dev are
#      installed (apt-get as root; else the command is printed). The runtime
#      (libFuzzer, ASan, UBSan) is in libclang-rt-14-dev, which clang-14 only
#      recommends, so it is named explicitly. llvm-14 is added when no
#      llvm-symbolizer is found: without it stack traces are bare addresses.
#   2. A build in build-fuzz/ (git-ignored): CC=clang, -DTHAW_FUZZ=ON, so
#      every module is built with coverage, ASan and UBSan; the targets and
#      tests/fuzz/gen_corpus.c.
#   3. Seeds: gen_corpus writes the binary seeds (.idx, .kv, .ckpt, libllama
#      states, blocks, manifests) with the real encoders (or after the
#      documented layout, checked by the parser) into build-fuzz/seeds/; a
#      warning says when the ones in
#      tests/fuzz/corpus/ differ (then run --regen-seeds and commit them).
#   4. Each target runs for SECONDS with its dictionary (tests/fuzz/dict/),
#      a -max_len sized to its format (table below) and a scratch corpus,
#      build-fuzz/corpus/<target>/, that starts from the committed and the
#      generated seeds and keeps what the fuzzer found from run to run
#      (rm -rf it to start over). Only --regen-seeds writes tests/fuzz/corpus/.
#
# Output, all under build-fuzz/: logs/<target>.log (the fuzzer's output),
# artifacts/<target>/crash-*|leak-*|timeout-*|oom-* (the reproducers).
# Exit status: 0 if no target failed; 1 if any crashed, leaked, hung or ran
# out of memory: each is printed with its reproducer, the command that
# replays it and the top of its report. 2 for a bad argument or a missing
# toolchain.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bld="$root/build-fuzz"
log() { printf '[fuzz] %s\n' "$*"; }
die() { printf '[fuzz] %s\n' "$*" >&2; exit 2; }

regen=0
coverage=0
secs=60
for a in "$@"; do
  case "$a" in
    --regen-seeds) regen=1 ;;
    --coverage) coverage=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *[!0-9]*|'') die "usage: scripts/fuzz.sh [--regen-seeds | --coverage] [SECONDS_PER_TARGET]" ;;
    *) secs=$a ;;
  esac
done
[ "$secs" -gt 0 ] || die "SECONDS_PER_TARGET must be > 0"

# -max_len per target, in bytes: a little past the largest input its format allows
max_len_of() {
  case "$1" in
    fuzz_chat_request) echo 8192 ;; # request bodies: a few turns plus tools / response_format
    fuzz_idx) echo 4352 ;;          # 144 + THAW_DISK_META_MAX (4096) + 8 = 4248, plus some
    fuzz_kvstate) echo 4096 ;;      # headers, a few hundred tokens and small fake state
    fuzz_kvlayout) echo 4096 ;;     # states and blocks of a few cells (seeds: 84-820 bytes)
    fuzz_manifest) echo 4096 ;;     # 40-byte header, tokens, ids, a tail block, an SWA section
    fuzz_s3_list) echo 8192 ;;      # listing pages of a few objects (an RGW page of 2: ~700 bytes)
    *) echo 4096 ;;
  esac
}

# the module whose parser a target fuzzes (--coverage reports on it)
module_of() {
  case "$1" in
    fuzz_chat_request) echo src/api/api.c ;;
    fuzz_idx) echo src/cache/cache_disk.c ;;
    fuzz_kvstate) echo src/llama/kvstate.c ;;
    fuzz_kvlayout) echo src/llama/kvlayout.c ;;
    fuzz_manifest) echo src/cache/blocks.c ;;
    fuzz_s3_list) echo src/cache/s3.c ;;
  esac
}

# ---- 1. toolchain -------------------------------------------------------------
# 0 if compiler $1 builds and links a libFuzzer target with ASan and UBSan.
probe() {
  local d rc
  d=$(mktemp -d)
  printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' >"$d/p.c"
  rc=0
  "$1" -fsanitize=fuzzer,address,undefined "$d/p.c" -o "$d/p" >/dev/null 2>&1 || rc=1
  rm -rf "$d"
  return $rc
}

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian packages: $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    echo "fuzzing needs these Debian packages; run:" >&2
    echo "  sudo apt-get install -y --no-install-recommends $*" >&2
    exit 2
  fi
}

cc=""
if [ -n "${CC:-}" ]; then
  probe "$CC" || die "CC=$CC cannot link a libFuzzer target (-fsanitize=fuzzer,address,undefined)"
  cc=$CC
else
  for c in clang clang-14; do
    if command -v "$c" >/dev/null 2>&1 && probe "$c"; then cc=$c; break; fi
  done
  if [ -z "$cc" ]; then
    apt_install clang-14 libclang-rt-14-dev
    probe clang-14 || die "clang-14 still cannot link a libFuzzer target"
    cc=clang-14
  fi
fi
cc=$(command -v "$cc")
# template.cpp is C++: the same clang's C++ driver, with the same sanitizers
cxx=${CXX:-${cc/%clang/clang++}}
cxx=${cxx/%clang-14/clang++-14}
command -v "$cxx" >/dev/null 2>&1 || die "no C++ compiler to match $cc (set CXX)"

# ASan/UBSan symbolise through llvm-symbolizer: next to the compiler, or on PATH
find_symbolizer() {
  local s
  s=$("$cc" -print-prog-name=llvm-symbolizer 2>/dev/null || true)
  if [ -n "$s" ] && [ "${s#/}" != "$s" ] && [ -x "$s" ]; then echo "$s"; return; fi
  command -v llvm-symbolizer 2>/dev/null || command -v llvm-symbolizer-14 2>/dev/null || true
}
sym=$(find_symbolizer)
if [ -z "$sym" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt_install llvm-14
  sym=$(find_symbolizer)
  [ -n "$sym" ] || sym=$(ls /usr/lib/llvm-14/bin/llvm-symbolizer 2>/dev/null || true)
fi
[ -n "$sym" ] || log "warning: no llvm-symbolizer: stack traces will be addresses (install llvm-14)"
log "compiler: $cc ($("$cc" --version | head -1))${sym:+, symbolizer: $sym}"

if [ -z "${LLAMA_PREFIX:-}" ] && [ ! -f "$root/.deps/llama/include/llama.h" ]; then
  die "no .deps/llama: run scripts/setup.sh first"
fi

# ---- 2. build -------------------------------------------------------------------
targets=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
  t=$(basename "$src" .c)
  if [ -n "${FUZZ_TARGETS:-}" ] && [[ " $FUZZ_TARGETS " != *" $t "* ]]; then continue; fi
  targets+=("$t")
done
[ ${#targets[@]} -gt 0 ] || die "no fuzz targets selected (FUZZ_TARGETS=${FUZZ_TARGETS:-})"

log "configuring $bld"
mkdir -p "$bld"
cmake -S "$root" -B "$bld" -DTHAW_FUZZ=ON -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  >"$bld/configure.log" 2>&1 || { cat "$bld/configure.log" >&2; die "cmake configure failed"; }
log "building ${targets[*]} gen_corpus"
cmake --build "$bld" -j"$(nproc)" --target "${targets[@]}" gen_corpus >"$bld/build.log" 2>&1 ||
  { tail -50 "$bld/build.log" >&2; die "build failed (build-fuzz/build.log)"; }

# ---- 3. seeds -------------------------------------------------------------------
rm -rf "$bld/seeds"
"$bld/gen_corpus" "$bld/seeds"
if [ $regen = 1 ]; then
  for d in "$bld"/seeds/*/; do
    t=$(basename "$d")
    mkdir -p "$root/tests/fuzz/corpus/$t"
    cp -f "$d"* "$root/tests/fuzz/corpus/$t/"
    log "wrote $(ls "$d" | wc -l) seeds to tests/fuzz/corpus/$t/"
  done
  exit 0
fi
stale=()
for f in "$bld"/seeds/*/*; do
  rel=${f#"$bld/seeds/"}
  cmp -s "$f" "$root/tests/fuzz/corpus/$rel" || stale+=("$rel")
done
if [ ${#stale[@]} -gt 0 ]; then
  log "warning: committed seeds differ from what the encoders write now: ${stale[*]}"
  log "         (a format changed?) run scripts/fuzz.sh --regen-seeds and commit tests/fuzz/corpus/"
fi

# ---- coverage (--coverage) ------------------------------------------------------
# An LLVM tool of the compiler's version: next to it, or on PATH.
llvm_tool() {
  local s
  s=$("$cc" -print-prog-name="$1" 2>/dev/null || true)
  if [ -n "$s" ] && [ "${s#/}" != "$s" ] && [ -x "$s" ]; then echo "$s"; return; fi
  command -v "$1" 2>/dev/null || command -v "$1-14" 2>/dev/null || true
}
if [ $coverage = 1 ]; then
  profdata=$(llvm_tool llvm-profdata)
  llvmcov=$(llvm_tool llvm-cov)
  [ -n "$profdata" ] && [ -n "$llvmcov" ] || die "--coverage needs llvm-profdata and llvm-cov (llvm-14)"
  covb="$bld/cov"
  mkdir -p "$covb"
  log "building the coverage build in build-fuzz/cov"
  cmake -S "$root" -B "$covb" -DTHAW_FUZZ=ON -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="-fprofile-instr-generate -fcoverage-mapping" \
    -DCMAKE_EXE_LINKER_FLAGS="-fprofile-instr-generate" >"$covb/configure.log" 2>&1 ||
    { cat "$covb/configure.log" >&2; die "cmake configure failed"; }
  cmake --build "$covb" -j"$(nproc)" --target "${targets[@]}" >"$covb/build.log" 2>&1 ||
    { tail -50 "$covb/build.log" >&2; die "build failed (build-fuzz/cov/build.log)"; }
  for t in "${targets[@]}"; do
    inputs=("$bld/corpus/$t")
    if [ -z "$(ls -A "$bld/corpus/$t" 2>/dev/null)" ]; then
      inputs=()
      for d in "$root/tests/fuzz/corpus/$t" "$bld/seeds/$t"; do [ -d "$d" ] && inputs+=("$d"); done
    fi
    [ ${#inputs[@]} -gt 0 ] || { log "$t: no corpus"; continue; }
    rm -f "$covb/$t.profraw"
    LLVM_PROFILE_FILE="$covb/$t.profraw" "$covb/$t" -runs=0 "${inputs[@]}" >"$covb/$t.log" 2>&1 || true
    [ -f "$covb/$t.profraw" ] || { log "$t: no profile (an input crashed? see build-fuzz/cov/$t.log)"; continue; }
    "$profdata" merge -sparse "$covb/$t.profraw" -o "$covb/$t.profdata"
    echo
    log "$t over ${inputs[*]#"$root/"}: the functions of $(module_of "$t") it reaches"
    # rows of functions never entered (0.00% of regions) are left out
    "$llvmcov" report -show-functions "$covb/$t" -instr-profile="$covb/$t.profdata" "$root/$(module_of "$t")" |
      awk 'NR <= 3 || ($4 != "0.00%" && $1 != "TOTAL" && NF >= 10)' | sed 's/^/  /'
  done
  exit 0
fi

# ---- 4. fuzz --------------------------------------------------------------------
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
[ -z "$sym" ] || export ASAN_SYMBOLIZER_PATH="$sym" UBSAN_SYMBOLIZER_PATH="$sym"

mkdir -p "$bld/logs"
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus="$bld/corpus/$t"
  art="$bld/artifacts/$t"
  logf="$bld/logs/$t.log"
  dict="$root/tests/fuzz/dict/$t.dict"
  mkdir -p "$corpus" "$art"
  for seeds in "$root/tests/fuzz/corpus/$t" "$bld/seeds/$t"; do
    [ -d "$seeds" ] && cp -f "$seeds"/* "$corpus"/ 2>/dev/null || true
  done
  args=(-max_total_time="$secs" -max_len="$(max_len_of "$t")" -timeout=10 -rss_limit_mb=2048
        -use_value_profile=1 -print_final_stats=1 -artifact_prefix="$art/")
  [ -f "$dict" ] && args+=(-dict="$dict")
  [ "${FUZZ_KEEP_GOING:-0}" = 0 ] || args+=(-fork=1 -ignore_crashes=1)
  stamp=$(mktemp)
  log "$t: ${secs}s, $(ls "$corpus" | wc -l) inputs in build-fuzz/corpus/$t, max_len $(max_len_of "$t")"
  rc=0
  "$bld/$t" "${args[@]}" "$corpus" >"$logf" 2>&1 || rc=$?
  done_line=$(grep -E '^#[0-9]+.*(DONE|cov:)' "$logf" | tail -1 || true)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logf" | tail -1)
  summary+=("$(printf '%-20s %s  exec/s %s' "$t" "${done_line:-no stats}" "${eps:-?}")")
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo
    log "$t FAILED (exit $rc); log: ${logf#"$root/"}"
    mapfile -t repro < <(find "$art" -type f -newer "$stamp" \
      \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
    [ ${#repro[@]} -gt 0 ] || log "  (no reproducer written: see the log)"
    for f in "${repro[@]:0:5}"; do
      log "  reproducer: ${f#"$root/"} ($(stat -c %s "$f") bytes)"
      log "  replay:     build-fuzz/$t ${f#"$root/"}"
    done
    [ ${#repro[@]} -le 5 ] || log "  ... and $((${#repro[@]} - 5)) more in ${art#"$root/"}/"
    # the report: from the sanitizer's or libFuzzer's first error line, 40 lines
    awk '/^==[0-9]+==ERROR|runtime error:|^==[0-9]+== ERROR: libFuzzer/ {p=1} p && n++ < 40' "$logf" | sed 's/^/    /'
    echo
  fi
  rm -f "$stamp"
done

echo
log "summary (${secs}s per target; logs in build-fuzz/logs/):"
for s in "${summary[@]}"; do echo "  $s"; done
if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED: ${failed[*]}"
  exit 1
fi
log "no crashes"
