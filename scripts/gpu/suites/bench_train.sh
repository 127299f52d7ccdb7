# Suite "bench-train" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh): the
# training overhead to ±0.5% (issue 14 item 2; docs/performance.md, "Training overhead
# to ±0.5%: method"). Each workload runs once under gpuguard with
# scripts/bench/train_bench.py --ab-blocks: after its warm-up, blocks of identical
# steps alternate books on / paused (gpuguard_bench_set_books, a benchmark aid that only
# the benchmark build has: target/bench-lib/release/libgpuguard.so, from
# scripts/bench/build_bench_lib.sh, carried) in ABBA order inside the one process; scripts/bench/ab_analyze.py turns the blocks into the
# overhead with its 95% interval (one ABR line per workload).
#
# Runs (names for GGV_ONLY):
#   torch_default torch_expandable torch_async   PyTorch, three allocator modes
#   jax cupy                                    default settings
#   torch_lines                                 PyTorch default, GPUGUARD_PYTHON=lines
#                                               (the recorder switched with the books)
#   torch_async_bare   only when GGV_ONLY names it: the same blocks without gpuguard,
#                      an A/A control whose interval must hold 1.0
# Every run gets GGV_BENCH_TRAIN_AB_S seconds of blocks (default: what the budget
# leaves after ~40 s of start-up and warm-up per run, split evenly, 20..300 s), so all
# six fit one 10-minute call (~50 s each) and three of them get ~140 s each.
#
# Each block also carries the user-space CPU cycles and instructions of all the
# process's threads where the machine allows hardware counters (perf_event_open): a
# row whose wall interval is wider than the target but whose cycles interval is not
# is PASS (the process is CPU-bound; cycles leave out time the host gave to others),
# and so is one whose median pair's interval reached it (ab_analyze.py: spells of host
# slow-down make the pairs heavy-tailed).
#
# Results: $OUT/bench_train.txt (the ABR lines), each run's stdout/stderr and ab.json in
# runs.tar.gz; the summary has one row per run: PASS when the interval reached the
# target half-width, WARN when it did not (the row says how many pairs it needs), FAIL
# when the run or its analysis failed.
# Knobs: GGV_BENCH_TRAIN_BUDGET_S (540), GGV_BENCH_TRAIN_AB_S, GGV_BENCH_TRAIN_PAIR_NS
# (added ns a hooked pair costs, for the call-count bound; default 2000, or bench-micro's
# figure), GGV_BENCH_TRAIN_PASSTHROUGH_NS (60: a paused pair, MICROBENCH_PAUSE=1),
# GGV_BENCH_TRAIN_BLOCK_MS (150), GGV_BENCH_TRAIN_BLOCK_STEPS (steps a block, instead
# of whole passes lasting BLOCK_MS; 1 pairs adjacent identical steps), GGV_BENCH_TRAIN_ENV
# (assignments given to every run, e.g. "GPUGUARD_STACK_DEPTH=0": validate.sh clears
# every inherited GPUGUARD_* setting but GPUGUARD_LOG, so a setting to measure goes
# here).

suite_bench_train() {
  suite_begin bench-train 540
  local all="torch_default torch_expandable torch_async jax cupy torch_lines" runs="" r
  for r in $all; do wanted "$r" && runs+=" $r"; done
  [[ " ${GGV_ONLY:-} " == *" torch_async_bare "* ]] && runs+=" torch_async_bare"
  local n
  n=$(echo $runs | wc -w)
  [ "$n" -gt 0 ] || return 0
  if [ ! -f "$BENCH_LIB" ]; then
    echo "bench-train: $BENCH_LIB missing (build it with scripts/bench/build_bench_lib.sh and carry it)"
    echo "{\"workload\": \"bench-train\", \"status\": \"FAIL\", \"problems\": [\"no benchmark build\"]}" >>"$SUMMARY"
    return 0
  fi
  local ab=${GGV_BENCH_TRAIN_AB_S:-$(((BUDGET - 40 * n) / n))}
  [ "$ab" -lt 20 ] && ab=20
  [ "$ab" -gt 300 ] && ab=300
  echo "bench-train: runs:$runs; ${ab}s of A/B blocks each"
  : >"$SW/bench_train.txt"
  for r in $runs; do
    local d=$SW/runs/$r wl=torch conf="" lines="" preload=$BENCH_LIB
    mkdir -p "$d/reports"
    case $r in
      torch_default) ;;
      torch_expandable) conf=$(torch_conf expandable) ;;
      torch_async | torch_async_bare) conf=$(torch_conf cudaMallocAsync) ;;
      torch_lines) lines=lines ;;
      jax | cupy) wl=$r ;;
    esac
    [ "$r" = torch_async_bare ] && preload=
    local left
    left=$(left_s)
    if [ "$left" -lt 45 ]; then
      echo "bench-train: $r skipped, ${left}s left"
      echo "{\"workload\": \"$r\", \"status\": \"SKIP\", \"problems\": [\"budget spent\"]}" >>"$SUMMARY"
      continue
    fi
    local t0 rc
    t0=$(stamp)
    section "bench-train $r"
    (
      cd "$d" || exit 2
      [ -n "$conf" ] && export PYTORCH_CUDA_ALLOC_CONF=$conf
      [ -n "$lines" ] && export GPUGUARD_PYTHON=$lines
      [ -n "$preload" ] && export LD_PRELOAD=$preload
      local kv
      for kv in ${GGV_BENCH_TRAIN_ENV:-}; do export "${kv?}"; done
      export GPUGUARD_DIR=$d/reports
      exec timeout -k 5 "$((ab + 100 < left ? ab + 100 : left))" "$PY" "$ROOT/scripts/bench/train_bench.py" "$wl" \
        --warmup 32 --ab-blocks 1000000 --ab-seconds "$ab" --block-ms "${GGV_BENCH_TRAIN_BLOCK_MS:-150}" \
        ${GGV_BENCH_TRAIN_BLOCK_STEPS:+--block-steps "$GGV_BENCH_TRAIN_BLOCK_STEPS"}
    ) >"$d/stdout" 2>"$d/stderr"
    rc=$?
    "$PY" "$ROOT/scripts/bench/ab_analyze.py" "$d/stdout" --json "$d/ab.json" \
      --pair-ns "${GGV_BENCH_TRAIN_PAIR_NS:-2000}" --passthrough-ns "${GGV_BENCH_TRAIN_PASSTHROUGH_NS:-60}" \
      >"$d/ab.txt" 2>&1
    sed "s/workload=[^ ]*/workload=$r/" "$d/ab.txt" | tee -a "$SW/bench_train.txt"
    tail -3 "$d/stderr"
    echo "bench-train $r: rc=$rc in $(since "$t0")s"
    "$PY" - "$SUMMARY" "$r" "$rc" "$d/ab.json" <<'PYEOF'
import json, sys
path, name, rc, res = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    r = json.load(open(res))[0]
except Exception as e:  # noqa: BLE001
    r = {"error": "no analysis: %s" % e}
probs = ([] if rc == 0 else ["train_bench.py exit status %d" % rc])
if "error" in r:
    probs.append(r["error"])
status = "FAIL" if probs else "PASS"
cyc = r.get("cycles_half_width")
if not probs and not r.get("precision_met") and cyc is not None and cyc <= r["target"]:
    status = "PASS"  # the cycles' interval reached the target (the wall's did not)
elif not probs and not r.get("precision_met") and r.get("robust_precision_met"):
    status = "PASS"  # the median's interval reached the target (heavy-tailed host noise)
elif not probs and not r.get("precision_met"):
    status = "WARN"
    probs.append("half-width %.2f%% > %.2f%%: %d pairs needed, %d run"
                 % (100 * r["half_width"], 100 * r["target"], r["pairs_needed"], r["pairs"]))
if not probs and name.endswith("_bare") and not (r["ratio_ci"][0] <= 1.0 <= r["ratio_ci"][1]):
    status = "FAIL"
    probs.append("A/A control: interval [%.4f, %.4f] misses 1.0" % tuple(r["ratio_ci"]))
keep = {k: r.get(k) for k in ("pairs", "ratio", "ratio_ci", "ratio_floor", "wall_overhead", "wall_ci",
                              "cpu_overhead", "cpu_ci", "half_width", "robust_overhead", "robust_ci", "robust_ratio",
                              "robust_ratio_ci", "robust_half_width", "cycles_overhead", "cycles_ci",
                              "cycles_ratio", "cycles_ratio_ci", "cycles_half_width", "instructions_overhead",
                              "instructions_ci", "calls_per_step", "bound",
                              "passthrough_bound", "step_ms", "steps_per_block")}
with open(path, "a") as f:
    f.write(json.dumps({"workload": name, "status": status, "rc": rc, "problems": probs, "data": keep}) + "\n")
PYEOF
  done
  cp "$SW/bench_train.txt" "$OUT/" 2>/dev/null
  return 0
}
