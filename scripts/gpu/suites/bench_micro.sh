# Suite "bench-micro" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh): the
# GPU allocation microbenchmark (scripts/bench/run_gpu.sh: bare / stacks off / the
# default depth with every stack captured, interleaved rounds; figures in
# docs/performance.md). Its micro_results.txt and micro_summary.md come back in $OUT;
# the summary has one row (rc, results present).
# Knobs: GGV_BENCH_MICRO_BUDGET_S (default 170) and run_gpu.sh's (ROUNDS, THREADS, ...).

suite_bench_micro() {
  suite_begin bench-micro 170
  local rc n
  OUT=$SW BENCH_WORK=$SW/work MICRO_BUDGET_S=$((BUDGET > 40 ? BUDGET - 20 : 20)) \
    timeout -k 5 "$((BUDGET > 30 ? BUDGET : 30))" bash "$ROOT/scripts/bench/run_gpu.sh"
  rc=$?
  n=$(grep -c ' GG \| GM ' "$SW/micro_results.txt" 2>/dev/null)
  cp "$SW/micro_results.txt" "$SW/micro_summary.md" "$OUT/" 2>/dev/null
  "$PY" - "$SUMMARY" "$rc" "${n:-0}" <<'PYEOF'
import json, sys
path, rc, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
probs = ([] if rc == 0 else ["run_gpu.sh exit status %d" % rc]) + ([] if n else ["no result lines"])
with open(path, "a") as f:
    f.write(json.dumps({"workload": "gpu_microbench", "status": "FAIL" if probs else "PASS", "rc": rc,
                        "result_lines": n, "problems": probs}) + "\n")
PYEOF
  return 0
}
