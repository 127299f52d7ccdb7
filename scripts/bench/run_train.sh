#!/usr/bin/env bash
# gpuguard training-throughput benchmark: interleaved pairs of whole runs, bare and
# under gpuguard at default settings (LD_PRELOAD only), of scripts/bench/train_bench.py:
#   torch-default  PyTorch, default caching allocator
#   torch-async    PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
#   jax            JAX (default preallocation)
#   cupy           CuPy (default memory pool)
# Pair order alternates (bare first in odd rounds, gpuguard first in even ones). Every
# run under gpuguard also reports the allocations gpuguard intercepted during the timed
# steps (CALLS lines), for the analytic bound.
#
#   bash scripts/bench/run_train.sh      (needs target/release/libgpuguard.so)
#
# Budget: TRAIN_BUDGET_S (default 280 s). A pair starts only if its estimated time (the
# last run of that workload, doubled) fits; JAX and CuPy pairs also leave room for the
# PyTorch pairs still to come, so with a short budget they get fewer pairs; with
# TORCH_RESERVE=0 they do not, and the rounds simply run in turn until the budget ends
# (every workload gets the same number of pairs, give or take the last round).
# Knobs: OUT (/tmp/gg-bench-out), PAIRS (5), WORKLOADS ("torch-default torch-async jax
# cupy"), TORCH_STEPS (60), JAX_STEPS (300), CUPY_STEPS (300), WARMUP (20), RUN_TIMEOUT_S
# (150), MICRO_RESULTS (a micro_results.txt for the bound; default $OUT/micro_results.txt),
# TORCH_RESERVE (1), GG_BENCH_WAIT_S (train_bench.py's diagnostics).
# Writes $OUT/train_results.txt and $OUT/train_summary.md; logs under $BENCH_WORK/train.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/gg-bench-out}
WORK=${BENCH_WORK:-/tmp/ggbench}/train
BUDGET=${TRAIN_BUDGET_S:-280}
PAIRS=${PAIRS:-5}
WORKLOADS=${WORKLOADS:-"torch-default torch-async jax cupy"}
WARMUP=${WARMUP:-20}
RUN_TIMEOUT=${RUN_TIMEOUT_S:-150}
LIB=$ROOT/target/release/libgpuguard.so
PY=${PYTHON:-python3}
MICRO_RESULTS=${MICRO_RESULTS:-$OUT/micro_results.txt}
mkdir -p "$OUT" "$WORK/reports"
RES=$OUT/train_results.txt
: >"$RES"
START=$(date +%s)
say() { printf '[run_train t=%ss] %s\n' "$(($(date +%s) - START))" "$*"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TF_CPP_MIN_LOG_LEVEL=2
[ -f "$LIB" ] || { say "missing $LIB"; exit 1; }

declare -A EST=([torch-default]=40 [torch-async]=40 [jax]=30 [cupy]=20)
declare -A DONE=()

# run_one WORKLOAD VARIANT ROUND: one process, lines tagged into $RES
run_one() {
  local w=$1 v=$2 r=$3 args env_extra=() t0 rc
  case $w in
  torch-default) args=(torch --steps "${TORCH_STEPS:-60}") ;;
  torch-async) args=(torch --steps "${TORCH_STEPS:-60}"); env_extra=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
  jax) args=(jax --steps "${JAX_STEPS:-300}") ;;
  cupy) args=(cupy --steps "${CUPY_STEPS:-300}") ;;
  esac
  [ "$v" = gg ] && env_extra+=(LD_PRELOAD="$LIB" GPUGUARD_DIR="$WORK/reports")
  t0=$(date +%s)
  env ${env_extra[@]+"${env_extra[@]}"} timeout "$RUN_TIMEOUT" "$PY" "$ROOT/scripts/bench/train_bench.py" \
    "${args[@]}" --warmup "$WARMUP" >"$WORK/$w.$v.$r.out" 2>"$WORK/$w.$v.$r.err"
  rc=$?
  sed "s/^/TR round=$r variant=$v /" "$WORK/$w.$v.$r.out" >>"$RES"
  EST[$w]=$(($(date +%s) - t0 + 1))
  local res
  res=$(grep -o 'steps_s=[0-9.]*' "$WORK/$w.$v.$r.out" | head -1)
  say "$w $v round $r: rc=$rc ${res:-no result} (${EST[$w]} s)"
  if [ "$rc" != 0 ]; then
    grep -v '^gpuguard\[' "$WORK/$w.$v.$r.err" | tail -4 | sed 's/^/    /'
  fi
  rm -f "$WORK"/reports/gpuguard.* 2>/dev/null
  return $rc
}

left() { echo $((BUDGET - ($(date +%s) - START))); }

for r in $(seq 1 "$PAIRS"); do
  for w in $WORKLOADS; do
    need=$((2 * ${EST[$w]}))
    reserve=0
    case ${TORCH_RESERVE:-1}:$w in
    0:*) ;;
    *:jax | *:cupy)
      # keep time for the PyTorch pairs of the rounds after this one
      for tw in torch-default torch-async; do
        case " $WORKLOADS " in *" $tw "*) reserve=$((reserve + (PAIRS - r) * 2 * ${EST[$tw]})) ;; esac
      done
      ;;
    esac
    if [ "$(left)" -lt $((need + reserve)) ]; then
      say "skip $w round $r: $(left) s left, pair needs ~$need s (+$reserve s kept for PyTorch)"
      continue
    fi
    if [ $((r % 2)) = 1 ]; then order=(bare gg); else order=(gg bare); fi
    for v in "${order[@]}"; do
      run_one "$w" "$v" "$r"
    done
    DONE[$w]=$((${DONE[$w]:-0} + 1))
  done
done
for w in $WORKLOADS; do say "$w: ${DONE[$w]:-0} pairs"; done

# the GPU added cost per pair for the analytic bound, if the microbenchmark ran
"$PY" "$ROOT/scripts/bench/summarize.py" train "$RES" "$MICRO_RESULTS" >"$OUT/train_summary.md" 2>&1
[ "${QUIET_SUMMARY:-0}" = 1 ] || cat "$OUT/train_summary.md"
say "train done"
