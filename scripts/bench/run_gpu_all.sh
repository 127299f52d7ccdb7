#!/usr/bin/env bash
# The whole GPU benchmark of gpuguard in one command (about 9 minutes at most):
#
#   bash scripts/bench/run_gpu_all.sh
#
# run from the repository root on the GPU machine, with target/release/libgpuguard.so
# built and carried. Runs scripts/bench/run_gpu.sh (the allocation microbenchmark,
# ~2.5 min) and then scripts/bench/run_train.sh (PyTorch default and cudaMallocAsync,
# JAX, CuPy: interleaved bare / gpuguard pairs, in the time left), and prints a summary.
#
# Writes 8 files into $OUT: summary.md (all tables), bench.log (this console),
# env.txt, micro_results.txt, micro_summary.md, train_results.txt, train_summary.md,
# logs.tar.gz (build log, every run's stderr), report_cost.txt (report time and RSS with
# 1M live allocations on this machine's CPU). Knobs: TOTAL_BUDGET_S (530),
# MICRO_BUDGET_S (150), and those of the two scripts.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
# Every allocation's stack (GPUGUARD_STACK_RATE=all): a tight loop allocates far past
# the default rate, so the default would leave most of its allocations without a stack
# and hide what a capture costs (a program allocating slowly pays it on every one).
export GPUGUARD_STACK_RATE=all
export OUT=${OUT:-/tmp/gg-bench-out}
export BENCH_WORK=${BENCH_WORK:-/tmp/ggbench}
TOTAL=${TOTAL_BUDGET_S:-530}
export MICRO_BUDGET_S=${MICRO_BUDGET_S:-150}
mkdir -p "$OUT"
rm -rf "$BENCH_WORK"
mkdir -p "$BENCH_WORK"
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$(elapsed)"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

LIB=$ROOT/target/release/libgpuguard.so
export QUIET_SUMMARY=1

main() {
section environment
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $(nproc)"
  echo "--- nvidia-smi"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,persistence_mode --format=csv 2>&1
  echo "--- nvcc: $(nvcc --version 2>&1 | tail -1)"
  python3 - <<'EOF' 2>&1
import importlib.metadata as m, sys
print("python", sys.version.split()[0])
for p in ("torch", "jax", "jaxlib", "cupy-cuda13x", "numpy"):
    try:
        print(p, m.version(p))
    except Exception as e:  # noqa: BLE001
        print(p, "missing", e)
EOF
  if [ -f "$LIB" ]; then
    echo "libgpuguard.so: $(sha256sum "$LIB" | cut -d' ' -f1) $(stat -c '%s bytes %y' "$LIB")"
  else
    echo "libgpuguard.so: MISSING at $LIB"
  fi
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
} | tee "$OUT/env.txt"
[ -f "$LIB" ] || { echo "no libgpuguard.so: nothing to measure"; return 1; }

section "microbenchmark (run_gpu.sh)"
timeout $((MICRO_BUDGET_S + 60)) bash "$ROOT/scripts/bench/run_gpu.sh"
echo "(run_gpu.sh exit status $?)"

section "report and memory cost on this machine's CPU (simulated driver, 1M live)"
# The same measurement as run_cpu.sh's report step, on the GPU machine's faster CPU:
# the shim's cost here does not depend on the GPU.
(
  set +e
  B=$BENCH_WORK/cpu
  mkdir -p "$B" "$B/reports"
  sh tests/sim/build.sh "$B/sim" >"$B/build.log" 2>&1 &&
    cc -O2 -g -Wall -I tests/sim -o "$B/microbench" scripts/bench/microbench.c \
      -L"$B/sim" -Wl,-rpath,"$B/sim" -lcuda -ldl -lpthread >>"$B/build.log" 2>&1 || {
    echo "build failed"; tail -5 "$B/build.log"; exit 0; }
  for r in 1 2 3; do
    for d in 0 16; do
      SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=1 GPUGUARD_DIR=$B/reports GPUGUARD_LOG=off \
        GPUGUARD_STACK_DEPTH=$d LD_PRELOAD=$LIB timeout 120 "$B/microbench" --live 1000000 --reps 1 --iters 10 --report |
        grep -E "^(RSS|REPORT)" | sed "s/^/round=$r depth=$d /"
      rm -f "$B"/reports/*
    done
    SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=1 timeout 120 "$B/microbench" --live 1000000 --reps 1 --iters 10 |
      grep -E "^RSS" | sed "s/^/round=$r bare /"
  done
) 2>&1 | tee "$OUT/report_cost.txt"

section "training (run_train.sh)"
left=$((TOTAL - $(elapsed) - 15))
if [ "$left" -gt 60 ]; then
  TRAIN_BUDGET_S=$((left - 10)) RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-120} \
    timeout "$left" bash "$ROOT/scripts/bench/run_train.sh"
  echo "(run_train.sh exit status $?)"
else
  echo "no time left for training ($left s)"
fi

section summary
{
  echo "# gpuguard GPU benchmark, $(date -u +%FT%TZ)"
  echo
  echo '```'
  cat "$OUT/env.txt"
  echo '```'
  echo
  echo "## Allocation microbenchmark (scripts/bench/gpu_microbench.c)"
  echo
  python3 "$ROOT/scripts/bench/summarize.py" micro "$OUT/micro_results.txt"
  echo
  echo "## Training throughput (scripts/bench/train_bench.py)"
  echo
  python3 "$ROOT/scripts/bench/summarize.py" train "$OUT/train_results.txt" "$OUT/micro_results.txt"
} >"$OUT/summary.md" 2>&1
tar -czf "$OUT/logs.tar.gz" -C "$BENCH_WORK" --exclude='reports' . 2>/dev/null
cat "$OUT/summary.md"
echo
echo "total $(elapsed) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/bench.log"
