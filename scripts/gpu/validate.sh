#!/usr/bin/env bash
# gpuguard's validation on a real GPU: the one command for the GPU machine.
#
#   bash scripts/gpu/validate.sh SUITE...          (from anywhere; default: core)
#
# Suites (run in the order given; one failing workload never stops the others):
#   core         framework workloads (PyTorch in three allocator modes, JAX two ways,
#                CuPy), CUDA C allocation paths, the cudarc client, inert processes
#                (suites/core.sh; runs 1 and 2 of docs/validation.md)
#   cudarc       core's cudarc_client workload alone
#   caps         memory caps, GPUGUARD_CAP (suites/caps.sh; run 2)
#   trim-leaks   trims and leak reports (suites/trim_leaks.sh; runs 7 and 10)
#   bench-micro  the GPU allocation microbenchmark (scripts/bench/run_gpu.sh)
#   bench-train  training overhead to ±0.5%: in-process A/B blocks, books on/paused, for
#                PyTorch (3 allocator modes, GPUGUARD_PYTHON=lines), JAX, CuPy
#                (suites/bench_train.sh; all six in one call, or split with GGV_ONLY)
#   reliability  graph endings soak (issue 11 item 8; suites/reliability.sh):
#     graph      CUDA-graph capture with backend:cudaMallocAsync, signals during capture
#     endings    SIGTERM / SIGTERM with a handler / SIGINT leave their reports
#     soak       a training soak with report and trim signals, next to a bare twin
#   soak-start, soak-wait   the soak in the background while the suites named between
#                them run, e.g.  validate.sh soak-start core graph endings soak-wait
#   multi        two GPUs, issue 15 runs 1-3 (scripts/gpu/multi/suite.sh): one process on
#                two devices (PyTorch three modes, JAX, peer copies), CUDA_VISIBLE_DEVICES
#                remapping, torchrun two ranks with a leak on rank 1
#   multi-soak   two GPUs, issue 15 run 4: a soak on both GPUs (a call of its own)
#   command      the gpuguard command around a PyTorch training run (issue 13): `run --cap
#                --trace`, with `ps`, `show --leaks`, `trim` while it runs, then `plot`
#                and `flamegraph` (suites/command.sh; about 2 minutes; mem.svg and
#                leaks.html come back in $OUT as files of their own)
#   all          core caps trim-leaks bench-micro reliability (more than one 10-minute
#                call: later suites are skipped when the shared budget is spent)
#
# Needs, in the repository copy: target/release/libgpuguard.so, target/release/gpuguard
# and, for core/cudarc, target/release/examples/cudarc_client (built elsewhere with
# cargo build --release [--example cudarc_client], carried over); for bench-train,
# target/bench-lib/release/libgpuguard.so (scripts/bench/build_bench_lib.sh). On the machine:
# python3 with torch, jax, cupy; nvcc; nvidia-smi. No network, no cargo.
#
# Every run is under LD_PRELOAD=<repo>/target/release/libgpuguard.so and its own
# GPUGUARD_DIR; no GPUGUARD_* setting but GPUGUARD_LOG is inherited (bench-train takes
# the settings to measure through GGV_BENCH_TRAIN_ENV).
#
# Results in $OUT (default /tmp/ggv-out; 4 files, plus bench-micro's 2, bench-train's 1
# and command's 2: at most 8 unless all three run in one call; each far below 16 MiB):
#   validate.log   this console: environment, every workload, each suite's own table,
#                  the final PASS/FAIL table
#   summary.txt    the final table, then every row of every suite, then the environment
#   summary.json   the same as data: {"table": [...], "suites": {name: {"rows": [...]}}}
#   runs.tar.gz    each run's stdout, stderr, reports, checks, CLI outputs; env.txt
#   micro_results.txt, micro_summary.md   (bench-micro only)
#   mem.svg, leaks.html   (command only) the run's memory plot and exit flame graph
#   bench_train.txt   (bench-train only) one ABR line per workload (ab_analyze.py)
# Exit status: 0 when no workload FAILed, 1 otherwise, 2 for a usage error.
#
# Budget: GGV_BUDGET_S (default 550) is shared: no suite starts or runs past it, and
# packing follows within ~30 s, so a whole call ends inside 10 minutes. Each suite
# also has its own: GGV_CORE_BUDGET_S (470), GGV_CAPS_BUDGET_S (320),
# GGV_TRIM_LEAKS_BUDGET_S (320), GGV_BENCH_MICRO_BUDGET_S (170),
# GGV_RELIABILITY_BUDGET_S (200, graph + endings), GGV_SOAK_S (540),
# GGV_BENCH_TRAIN_BUDGET_S (540), GGV_COMMAND_BUDGET_S (240).
# Other knobs: GGV_ONLY (run names across suites, e.g. "torch_default cupy"),
# GPUGUARD_LOG (default info), GGV_LIB / GGV_CLI / GGV_CLIENT (other builds), GGV_WORK
# (scratch, default /tmp/ggv), and each suite's (see its header in scripts/gpu/suites/).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

OUT=${OUT:-/tmp/ggv-out}
WORK=${GGV_WORK:-/tmp/ggv}
T0=$(date +%s)
TOTAL_END=$((T0 + ${GGV_BUDGET_S:-550}))
START=$T0
BUDGET=${GGV_BUDGET_S:-550}

# shellcheck source=lib/common.sh
. "$ROOT/scripts/gpu/lib/common.sh"
for f in core caps trim_leaks bench_micro bench_train reliability command; do
  # shellcheck disable=SC1090
  . "$ROOT/scripts/gpu/suites/$f.sh"
done
# shellcheck source=multi/suite.sh
. "$ROOT/scripts/gpu/multi/suite.sh"

SUITES=()
[ $# -eq 0 ] && set -- core
for a in "$@"; do
  case $a in
    all) SUITES+=(core caps trim-leaks bench-micro graph endings soak) ;;
    reliability) SUITES+=(graph endings soak) ;;
    core | cudarc | caps | trim-leaks | bench-micro | bench-train | graph | endings | soak | soak-start | soak-wait | multi | multi-soak | command) SUITES+=("$a") ;;
    -h | --help | help) usage; exit 0 ;;
    *) echo "unknown suite '$a'"; echo; usage; exit 2 ;;
  esac
done

main() {
  ggv_clean_env
  rm -rf "$WORK"
  mkdir -p "$WORK" "$OUT"
  echo "gpuguard GPU validation: ${SUITES[*]}; repo $ROOT, work $WORK, out $OUT, budget ${GGV_BUDGET_S:-550}s"
  record_env
  local s i n=${#SUITES[@]} dirs=""
  SOAK_PID=
  for ((i = 0; i < n; i++)); do
    s=${SUITES[$i]}
    case $s in
      core) (suite_core); dirs+=" core" ;;
      cudarc) (GGV_ONLY=${GGV_ONLY:-cudarc_client} suite_core); dirs+=" core" ;;
      caps) (suite_caps); dirs+=" caps" ;;
      trim-leaks) (suite_trim_leaks); dirs+=" trim-leaks" ;;
      bench-micro) (suite_bench_micro); dirs+=" bench-micro" ;;
      bench-train) (suite_bench_train); dirs+=" bench-train" ;;
      graph | endings)
        # graph and endings next to each other share one run of the suite.
        if [ "$s" = graph ] && [ "${SUITES[$((i + 1))]:-}" = endings ]; then
          (suite_rel_graph_endings "${GGV_RELIABILITY_BUDGET_S:-200}" "graph endings")
          i=$((i + 1))
        else
          (suite_rel_graph_endings "${GGV_RELIABILITY_BUDGET_S:-200}" "$s")
        fi
        dirs+=" reliability" ;;
      soak) soak_launch; soak_collect; dirs+=" soak" ;;
      soak-start) soak_launch; dirs+=" soak" ;;
      soak-wait) soak_collect ;;
      multi) (suite_multi); dirs+=" multi" ;;
      multi-soak) (suite_multi_soak); dirs+=" multi-soak" ;;
      command) (suite_command); dirs+=" command" ;;
    esac
  done
  [ -n "${SOAK_PID:-}" ] && soak_collect

  START=$T0
  section "pack"
  local ex=(--exclude='*/bin/*' --exclude='*/work/gpu_microbench' --exclude='*.f32')
  tar -C "$WORK" -czf "$OUT/runs.tar.gz" "${ex[@]}" . 2>/dev/null
  local sz
  sz=$(stat -c %s "$OUT/runs.tar.gz" 2>/dev/null || echo 0)
  if [ "$sz" -gt 15000000 ]; then
    echo "runs.tar.gz is $sz bytes: repacking without signal/request/trim reports"
    tar -C "$WORK" -czf "$OUT/runs.tar.gz" "${ex[@]}" --exclude='*.signal.json' --exclude='*.request.json' \
      --exclude='*.trim.json' . 2>/dev/null
    sz=$(stat -c %s "$OUT/runs.tar.gz" 2>/dev/null || echo 0)
  fi
  if [ "$sz" -gt 15000000 ]; then
    echo "runs.tar.gz is still $sz bytes: repacking without any report"
    tar -C "$WORK" -czf "$OUT/runs.tar.gz" "${ex[@]}" --exclude='*/reports/*' . 2>/dev/null
  fi
  ls -l "$OUT"

  section "summary: PASS/FAIL per suite and workload (every row: summary.txt)"
  # shellcheck disable=SC2086
  "$PY" "$GGV_PY" merge --work "$WORK" --txt "$OUT/summary.txt" --json "$OUT/summary.json" \
    --env "$WORK/env.txt" --suites "$(echo $dirs | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')"
  local rc=$?
  echo "total time $(($(date +%s) - T0))s"
  return "$rc"
}

mkdir -p "$OUT"
main 2>&1 | tee "$OUT/validate.log"
exit "${PIPESTATUS[0]}"
