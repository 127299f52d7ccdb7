#!/usr/bin/env bash
# gpuguard CPU benchmarks on the simulated CUDA driver (no GPU needed).
#
#   bash scripts/bench/run_cpu.sh            (from anywhere; ~13 minutes on 2 cores)
#
# 1. microbench, interleaved: for each ledger prefill (0, 100k, 1M live allocations)
#    and thread count (1, 2), ROUNDS rounds of three processes: bare (no shim), shim
#    with stacks off (GPUGUARD_STACK_DEPTH=0), shim with default stacks (16); the order
#    rotates every round. Each process times every path REPS times, each block next to
#    a block of the same pairs through the sim's own functions (the in-process delta).
#    A diagnostic group (DIAG_ROUNDS rounds): 2 threads spread over 2 simulated devices,
#    so per-device state is no longer shared between the threads.
#    A depth sweep (DEPTH_ROUNDS rounds): the pool path's in-process added cost for
#    GPUGUARD_STACK_DEPTH 1, 2, 4, 8, 16, 32 (under 40 extra frames).
# 2. the report: gpuguard_write_report timed with 100k and 1M live allocations.
# 3. callgrind: instructions per pair, hooked and raw, bare / stacks off / stacks 16,
#    and where the added instructions go (per function); and a profile of one report
#    with 100k live allocations.
# Prints the summary tables (markdown) at the end; everything is kept in $OUT.
#
# Knobs (environment): OUT (default target/bench/cpu-results), ROUNDS (7), REPS (10),
# ITERS (2500 pairs per block on link/dlsym/proc; vmm /2, pool x4), LIVES ("0 100000
# 1000000"), THREADS ("1 2"), REPORT_ROUNDS (3), DIAG_ROUNDS (3), DEPTH_ROUNDS (3),
# SKIP_BUILD=1, SKIP_CALLGRIND=1, SUMMARY_ONLY=1 (remake the tables from $OUT).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/target/bench/cpu-results}
BUILD=${BENCH_BUILD:-$ROOT/target/bench/cpu}
ROUNDS=${ROUNDS:-7}
REPS=${REPS:-10}
ITERS=${ITERS:-2500}
LIVES=${LIVES:-"0 100000 1000000"}
THREADS=${THREADS:-"1 2"}
REPORT_ROUNDS=${REPORT_ROUNDS:-3}
DIAG_ROUNDS=${DIAG_ROUNDS:-3}
DEPTH_ROUNDS=${DEPTH_ROUNDS:-3}
LIB=$ROOT/target/release/libgpuguard.so
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"
RES=$OUT/results.txt
START=$(date +%s)
say() { printf '[run_cpu t=%ss] %s\n' "$(($(date +%s) - START))" "$*" >&2; }

# ---- summary (also: SUMMARY_ONLY=1 remakes it from $OUT) -------------------------------
summarize() {
  say "summary"
  "$PY" scripts/bench/summarize.py micro "$RES" >"$OUT/summary.md" 2>&1
  if [ -d "$OUT/callgrind/s0" ]; then
    {
      echo
      echo "### callgrind: instructions per pair"
      echo
      echo "1 thread, empty ledger; s0 = stacks off, s16 = stacks 16 (default)."
      echo
      "$PY" scripts/bench/cg_summary.py totals bare="$OUT/callgrind/bare" s0="$OUT/callgrind/s0" \
        s16="$OUT/callgrind/s16"
      for v in s0 s16; do
        for p in link pool; do
          echo
          echo "### callgrind: where the added instructions go, $p path, $v"
          echo
          echo "Self instructions per pair, hooked − raw, by object and by function."
          echo
          "$PY" scripts/bench/cg_summary.py hot "$OUT/callgrind/$v" "$p" 25
        done
      done
      echo
      echo "### callgrind: one report"
      echo
      echo "gpuguard_write_report with 100k live allocations, stacks 16: self instructions."
      echo
      "$PY" scripts/bench/cg_summary.py top "$OUT/callgrind/report" report 30
    } >>"$OUT/summary.md" 2>&1
  fi
  cat "$OUT/summary.md"
  say "done; results in $OUT"
}
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then
  summarize
  exit 0
fi
: >"$RES"

# ---- build ------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  say "cargo build --release"
  cargo build --release >"$OUT/build.log" 2>&1 || { say "cargo build failed (see $OUT/build.log)"; exit 1; }
fi
[ -f "$LIB" ] || { say "missing $LIB"; exit 1; }
sh tests/sim/build.sh "$BUILD/sim" >>"$OUT/build.log" 2>&1 || { say "sim build failed"; exit 1; }
cc -O2 -g -fno-omit-frame-pointer -Wall -Wextra -I tests/sim -o "$BUILD/microbench" \
  scripts/bench/microbench.c -L"$BUILD/sim" -Wl,-rpath,"$BUILD/sim" -lcuda -ldl -lpthread \
  >>"$OUT/build.log" 2>&1 || { say "microbench build failed"; exit 1; }
MB=$BUILD/microbench

# ---- environment --------------------------------------------------------------------
REPORTS=$(mktemp -d /tmp/gg-bench-reports.XXXXXX)
# Every allocation's stack (GPUGUARD_STACK_RATE=all): a tight loop allocates far past
# the default rate, so the default would leave most of its allocations without a stack
# and hide what a capture costs (a program allocating slowly pays it on every one).
export GPUGUARD_STACK_RATE=all
export SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=1 GPUGUARD_DIR=$REPORTS GPUGUARD_LOG=warn
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "mem: $(grep MemTotal /proc/meminfo)"
  echo "cc: $(cc --version | head -1)"
  echo "rustc: $(rustc --version 2>/dev/null)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain -- src 2>/dev/null | wc -l) changed files under src/"
  echo "libgpuguard.so: $(sha256sum "$LIB" | cut -c1-16) $(stat -c '%s bytes, %y' "$LIB")"
  echo "valgrind: $(valgrind --version 2>/dev/null)"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2

# variant name -> environment prefix
venv() {
  case $1 in
  bare) echo "" ;;
  s0) echo "LD_PRELOAD=$LIB GPUGUARD_STACK_DEPTH=0" ;;
  s16) echo "LD_PRELOAD=$LIB" ;;
  esac
}

# run TAGS VARIANT TIMEOUT ARGS...: one process; every stdout line tagged into $RES
run_one() {
  local tags=$1 v=$2 to=$3
  shift 3
  local log=$OUT/last_stderr.txt
  # shellcheck disable=SC2046
  if ! env $(venv "$v") timeout "$to" "$@" 2>"$log" | sed "s/^/$tags variant=$v /" >>"$RES"; then
    :
  fi
  if [ -s "$log" ]; then
    grep -v '^gpuguard\[' "$log" | head -5 | sed "s/^/[$tags $v stderr] /" >&2
  fi
}

# ---- 1. interleaved microbench ---------------------------------------------------------
VARIANTS=(bare s0 s16)
for live in $LIVES; do
  for t in $THREADS; do
    for r in $(seq 1 "$ROUNDS"); do
      say "micro live=$live threads=$t round=$r/$ROUNDS"
      for k in 0 1 2; do
        v=${VARIANTS[$(((k + r) % 3))]}
        run_one "MB round=$r" "$v" 600 "$MB" --threads "$t" --iters "$ITERS" --reps "$REPS" --live "$live"
      done
    done
  done
done

# diagnostic: 2 threads on 2 devices (own context, pool and counters per thread)
for r in $(seq 1 "$DIAG_ROUNDS"); do
  say "micro diag devices=2 threads=2 round=$r/$DIAG_ROUNDS"
  for k in 0 1 2; do
    v=${VARIANTS[$(((k + r) % 3))]}
    SIMCUDA_DEVICES=2 run_one "MD round=$r" "$v" 600 "$MB" --threads 2 --devices 2 \
      --iters "$ITERS" --reps "$REPS" --live 0
  done
done

# depth sweep: what each captured frame costs
for r in $(seq 1 "$DEPTH_ROUNDS"); do
  say "depth sweep round=$r/$DEPTH_ROUNDS"
  for d in 1 2 4 8 16 32; do
    GPUGUARD_STACK_DEPTH=$d run_one "DS round=$r depth=$d" s16 600 "$MB" --paths pool \
      --iters "$ITERS" --reps "$REPS" --pad 40
  done
done

# ---- 2. report time -----------------------------------------------------------------------
for live in 100000 1000000; do
  for r in $(seq 1 "$REPORT_ROUNDS"); do
    for v in s0 s16; do
      say "report live=$live $v round=$r"
      run_one "RP round=$r" "$v" 600 "$MB" --live "$live" --report
      rm -f "$REPORTS"/gpuguard.* "$REPORTS"/.gpuguard.* 2>/dev/null
    done
  done
done

# ---- 3. callgrind ---------------------------------------------------------------------------
if [ "${SKIP_CALLGRIND:-0}" != 1 ] && command -v valgrind >/dev/null; then
  for v in bare s0 s16; do
    d=$OUT/callgrind/$v
    rm -rf "$d"
    mkdir -p "$d"
    say "callgrind $v"
    # shellcheck disable=SC2046
    (cd "$d" && env $(venv "$v") timeout 600 valgrind --tool=callgrind --compress-strings=no \
      --compress-pos=no --callgrind-out-file="$d/cg.out.%p" "$MB" --iters 1000 --reps 1 \
      >stdout.txt 2>valgrind.txt) || say "callgrind $v failed (see $d/valgrind.txt)"
  done
  d=$OUT/callgrind/report
  rm -rf "$d"
  mkdir -p "$d"
  say "callgrind report, 100k live"
  (cd "$d" && env LD_PRELOAD="$LIB" timeout 900 valgrind --tool=callgrind --compress-strings=no \
    --compress-pos=no --callgrind-out-file="$d/cg.out.%p" "$MB" --live 100000 --report \
    >stdout.txt 2>valgrind.txt) || say "callgrind report failed (see $d/valgrind.txt)"
  rm -f "$REPORTS"/gpuguard.* 2>/dev/null
fi
rm -rf "$REPORTS"

summarize
