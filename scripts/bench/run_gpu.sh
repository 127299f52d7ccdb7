#!/usr/bin/env bash
# gpuguard GPU microbenchmark: builds scripts/bench/gpu_microbench.c with nvcc and runs
# it interleaved: for each thread count (1, 16), ROUNDS rounds of three processes, bare
# (no shim), shim with stacks off (GPUGUARD_STACK_DEPTH=0), shim with the default depth
# of 16 frames and every stack captured (see below); the order rotates every round.
# Prints medians, min–max and the added cost per pair.
#
#   bash scripts/bench/run_gpu.sh        (from anywhere; needs target/release/libgpuguard.so)
#
# Knobs: OUT (default /tmp/gg-bench-out), ROUNDS (5), THREADS ("1 16"), REPS (3 blocks
# per path and kind per process), BLOCK_MS (30), MICRO_BUDGET_S (150: no new process
# starts after that; rounds left out are reported). Writes $OUT/micro_results.txt
# and $OUT/micro_summary.md; logs under $BENCH_WORK (default /tmp/ggbench/micro).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/gg-bench-out}
WORK=${BENCH_WORK:-/tmp/ggbench}/micro
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-"1 16"}
REPS=${REPS:-3}
BLOCK_MS=${BLOCK_MS:-30}
BUDGET=${MICRO_BUDGET_S:-150}
LIB=$ROOT/target/release/libgpuguard.so
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
RES=$OUT/micro_results.txt
: >"$RES"
START=$(date +%s)
say() { printf '[run_gpu t=%ss] %s\n' "$(($(date +%s) - START))" "$*"; }
# Every allocation's stack (GPUGUARD_STACK_RATE=all): a tight loop allocates far past
# the default rate, so the default would leave most of its allocations without a stack
# and hide what a capture costs (a program allocating slowly pays it on every one).
export GPUGUARD_STACK_RATE=all
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[ -f "$LIB" ] || { say "missing $LIB: build it with cargo build --release and carry it"; exit 1; }
REPORTS=$WORK/reports
mkdir -p "$REPORTS"
export GPUGUARD_DIR=$REPORTS GPUGUARD_LOG=warn

# ---- build --------------------------------------------------------------------------
BIN=$WORK/gpu_microbench
SRC=$ROOT/scripts/bench/gpu_microbench.c
say "build gpu_microbench"
if ! nvcc -O2 -g -cudart shared -Xcompiler -fno-omit-frame-pointer -o "$BIN" "$SRC" \
  -lcuda -ldl -lpthread >"$WORK/build.log" 2>&1; then
  nvcc -O2 -g -cudart shared -Xcompiler -fno-omit-frame-pointer -o "$BIN" "$SRC" \
    -L/usr/local/cuda/lib64/stubs -L/usr/local/cuda/targets/x86_64-linux/lib/stubs \
    -L/usr/local/nvidia/lib64 -lcuda -ldl -lpthread >>"$WORK/build.log" 2>&1
fi
if [ ! -x "$BIN" ]; then
  say "BUILD FAILED"
  tail -n 20 "$WORK/build.log"
  exit 1
fi
ldd "$BIN" | grep -E 'libcuda|libcudart' | sed 's/^/  /'

venv() {
  case $1 in
  bare) echo "" ;;
  s0) echo "LD_PRELOAD=$LIB GPUGUARD_STACK_DEPTH=0" ;;
  s16) echo "LD_PRELOAD=$LIB" ;;
  esac
}

n=0
VARIANTS=(bare s0 s16)
skipped=0
for r in $(seq 1 "$ROUNDS"); do
  for t in $THREADS; do
    for k in 0 1 2; do
      v=${VARIANTS[$(((k + r) % 3))]}
      if [ $(($(date +%s) - START)) -ge "$BUDGET" ]; then
        skipped=$((skipped + 1))
        continue
      fi
      n=$((n + 1))
      log=$WORK/run_${n}_${v}_t${t}_r${r}.stderr
      # shellcheck disable=SC2046
      env $(venv "$v") timeout 90 "$BIN" --threads "$t" --reps "$REPS" --block-ms "$BLOCK_MS" \
        2>"$log" | sed "s/^/GM round=$r variant=$v /" >>"$RES"
      rc=${PIPESTATUS[0]}
      last=$(grep "variant=$v INFO" "$RES" | tail -1 | grep -o 'init_ms=[0-9]*')
      say "round $r threads $t $v: rc=$rc $last"
      [ "$rc" = 0 ] || { grep -v '^gpuguard\[' "$log" | tail -5; }
    done
  done
  rm -f "$REPORTS"/gpuguard.* 2>/dev/null
done
[ "$skipped" -gt 0 ] && say "budget reached: $skipped runs left out"
grep ' GG ' "$RES" | tail -3
"$PY" "$ROOT/scripts/bench/summarize.py" micro "$RES" >"$OUT/micro_summary.md" 2>&1
[ "${QUIET_SUMMARY:-0}" = 1 ] || cat "$OUT/micro_summary.md"
say "micro done"
