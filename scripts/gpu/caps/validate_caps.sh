#!/usr/bin/env bash
# gpuguard GPU validation of memory caps (GPUGUARD_CAP): the one command.
#
#   bash scripts/gpu/caps/validate_caps.sh          (from the repository root)
#
# Needs, in the repo copy: target/release/libgpuguard.so and target/release/gpuguard
# (built elsewhere, carried over). On the machine: python3 with torch, jax, cupy;
# nvidia-smi; libnvidia-ml.so.1 (NVML, through ctypes: pynvml not needed).
#
# Each workload runs as
#   LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_CAP=<cap> GPUGUARD_DIR=<run>/reports
# while caps_monitor.py, started WITHOUT LD_PRELOAD, samples the GPU from outside
# every 50 ms through NVML (per-process used memory, and the device's). The
# workload prints GGV_BASELINE after CUDA init and before its first allocation and
# holds still, so the monitor sees the context's baseline; caps_check.py then
# reports max(real - baseline) against the cap, the workload's own PASS/FAIL
# lines, the cap reports (denial) and the exit report (cap_bytes, peak, denied,
# pool_reserved_bytes). A summary table closes the log.
#
# Workloads, in order (the required ones first):
#   nvidia_smi        nvidia-smi under the shim and the cap: runs, real total, no report
#   driver            ctypes on libcuda: fill to exactly the cap, a refusal on every
#                     allocation path, 8 threads racing for the last bytes
#   torch_default, torch_expandable, torch_async   torch_caps.py per allocator mode
#   jax_prealloc      jax_caps.py, default preallocation (75% of the cap)
#   cupy              cupy_caps.py
#   jax_platform      jax_caps.py, XLA_PYTHON_CLIENT_ALLOCATOR=platform (the cap refuses, not XLA's arena)
#   driver_perdevice  driver workload with GPUGUARD_CAP=0:<cap> (per-device form)
#   driver_fraction   driver workload with GPUGUARD_CAP=0.03 (fraction of cuDeviceTotalMem)
#
# Results in $OUT (3 files): caps.log (this console), caps_summary.json (one row per
# workload, with every check, the monitor analysis and report extracts, plus the
# environment), caps_runs.tar.gz (each run's stdout, stderr, monitor.csv, reports,
# check.json, gpuguard show of a cap report; env.txt).
#
# Knobs: GGV_CAP_GIB (default 4), GGV_BUDGET_S (seconds for the workloads, default
# 320, counted from the start, environment included), GGV_ONLY (space-separated
# workload names), GGV_MONITOR_INTERVAL (default 0.05), GPUGUARD_LOG (default info),
# GGV_LIB / GGV_CLI (other builds of libgpuguard.so / gpuguard).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/ggv-caps-out}
mkdir -p "$OUT"
WORK=${GGV_WORK:-/tmp/ggv-caps}
rm -rf "$WORK"
mkdir -p "$WORK/runs"
SUMMARY=$WORK/summary.jsonl
: >"$SUMMARY"

LIB=${GGV_LIB:-$ROOT/target/release/libgpuguard.so}
CLI=${GGV_CLI:-$ROOT/target/release/gpuguard}
PY=${PYTHON:-python3}
CAPS=$ROOT/scripts/gpu/caps
CAP_GIB=${GGV_CAP_GIB:-4}
CAP="${CAP_GIB}GiB"
CAP_BYTES=$((CAP_GIB << 30))
INTERVAL=${GGV_MONITOR_INTERVAL:-0.05}
START=$(date +%s)
BUDGET=${GGV_BUDGET_S:-320}
export GPUGUARD_LOG=${GPUGUARD_LOG:-info}
# Keep NVLink multicast off (machine rule), whatever a framework would do.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset LD_PRELOAD GPUGUARD_CAP PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR XLA_PYTHON_CLIENT_PREALLOCATE \
  XLA_PYTHON_CLIENT_MEM_FRACTION

section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$(($(date +%s) - START))"; }

record_env() {
  section "environment"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "uname: $(uname -srm)"
    echo "cap: GPUGUARD_CAP=$CAP ($CAP_BYTES bytes)"
    echo "--- nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "--- driver / memory"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
    echo "--- compute processes before the run"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
    echo "--- python"
    "$PY" - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "jax", "jaxlib", "cupy", "numpy"):
    try:
        mod = importlib.import_module(m)
        extra = ""
        if m == "torch":
            extra = " cuda=%s" % mod.version.cuda
        print(m, getattr(mod, "__version__", "?") + extra)
    except Exception as e:  # noqa: BLE001
        print(m, "NOT AVAILABLE:", repr(e)[:200])
EOF
    echo "--- artefacts"
    for f in "$LIB" "$CLI"; do
      if [ -e "$f" ]; then ls -l "$f"; sha256sum "$f"; else echo "MISSING $f"; fi
    done
    echo "--- gpuguard CLI"; "$CLI" --version 2>&1 | head -3
    echo "--- the library knows GPUGUARD_CAP"
    if grep -aq GPUGUARD_CAP "$LIB" 2>/dev/null; then echo "yes"; else echo "NO: this libgpuguard.so predates caps"; fi
    echo "--- real device size (cuDeviceTotalMem_v2, no shim)"
    "$PY" "$CAPS/caps_common.py" real-total 2>&1
  } 2>&1 | tee "$WORK/env.txt"
}

# Starts the outside monitor; waits until it is sampling.
start_monitor() {
  local d=$1 i
  env -u LD_PRELOAD "$PY" "$CAPS/caps_monitor.py" --out "$d/monitor.csv" --interval "$INTERVAL" \
    2>"$d/monitor.err" &
  MPID=$!
  for ((i = 0; i < 50; i++)); do
    grep -q '^t,' "$d/monitor.csv" 2>/dev/null && return 0
    grep -q '^# error' "$d/monitor.csv" 2>/dev/null && break
    kill -0 "$MPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "monitor not sampling: $(head -c 300 "$d/monitor.csv" 2>/dev/null) $(head -c 300 "$d/monitor.err" 2>/dev/null)"
}

stop_monitor() {
  sleep 0.3
  kill -TERM "$MPID" 2>/dev/null
  wait "$MPID" 2>/dev/null
}

# run_cap NAME TIMEOUT EXPECT_DENIAL(yes|no|any) CAP_SPEC CAP_BYTES -- ENV... -- CMD...
run_cap() {
  local name=$1 tmo=$2 expect=$3 spec=$4 bytes=$5
  shift 5
  [ "${1:-}" = "--" ] && shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  if [ -n "${GGV_ONLY:-}" ] && [[ " $GGV_ONLY " != *" $name "* ]]; then return 0; fi
  local d=$WORK/runs/$name
  mkdir -p "$d/reports"
  section "$name"
  local left=$((START + BUDGET - $(date +%s)))
  if [ "$left" -lt "$tmo" ]; then tmo=$left; fi
  if [ "$tmo" -lt 20 ]; then
    echo "SKIPPED: time budget spent (${left}s left)"
    "$PY" "$CAPS/caps_check.py" run --name "$name" --dir "$d" --rc -1 --cap-bytes "$bytes" \
      --summary "$SUMMARY" >/dev/null
    return 0
  fi
  echo "cmd: GPUGUARD_CAP=$spec (expect $bytes bytes) ${envs[*]} $* (timeout ${tmo}s)"
  start_monitor "$d"
  local t0 rc el
  t0=$(date +%s.%N)
  timeout -k 10 "$tmo" env "${envs[@]}" GGV_WORKLOAD="$name" GGV_CAP_BYTES="$bytes" \
    LD_PRELOAD="$LIB" GPUGUARD_CAP="$spec" GPUGUARD_DIR="$d/reports" "$@" >"$d/stdout.log" 2>"$d/stderr.log"
  rc=$?
  local t1
  t1=$(date +%s.%N)
  stop_monitor
  el=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  echo "exit status $rc after ${el}s; monitor: $(grep -c '^[0-9]' "$d/monitor.csv" 2>/dev/null) samples"
  echo "--- stderr: gpuguard lines (first 15)"
  grep -a '^gpuguard\[' "$d/stderr.log" | head -n 15
  echo "--- stderr: last other lines"
  grep -av '^gpuguard\[' "$d/stderr.log" | grep -av '^\s*$' | tail -n 6
  "$PY" "$CAPS/caps_check.py" run --name "$name" --dir "$d" --rc "$rc" --cap-bytes "$bytes" \
    --expect-denial "$expect" --elapsed "$el" --t-end "$t1" --summary "$SUMMARY"
  local caprep
  caprep=$(ls "$d"/reports/*.cap.json 2>/dev/null | head -n 1)
  if [ -n "$caprep" ] && [ -x "$CLI" ]; then
    echo "--- gpuguard show $(basename "$caprep") (first 25 lines)"
    "$CLI" show "$caprep" >"$d/show_cap.txt" 2>&1
    echo "(gpuguard show exit status $?)" >>"$d/show_cap.txt"
    head -n 25 "$d/show_cap.txt"
  fi
}

run_smi() {
  local name=nvidia_smi
  if [ -n "${GGV_ONLY:-}" ] && [[ " $GGV_ONLY " != *" $name "* ]]; then return 0; fi
  local d=$WORK/runs/$name
  mkdir -p "$d/reports"
  section "$name: nvidia-smi under the shim with GPUGUARD_CAP=$CAP"
  local q=(--query-gpu=memory.total,memory.used --format=csv,noheader,nounits)
  timeout 30 nvidia-smi "${q[@]}" >"$d/bare_query.txt" 2>"$d/bare_query.err"
  local rb=$?
  timeout 30 env LD_PRELOAD="$LIB" GPUGUARD_CAP="$CAP" GPUGUARD_DIR="$d/reports" \
    nvidia-smi "${q[@]}" >"$d/shim_query.txt" 2>"$d/shim_query.err"
  local rq=$?
  timeout 30 env LD_PRELOAD="$LIB" GPUGUARD_CAP="$CAP" GPUGUARD_DIR="$d/reports" \
    nvidia-smi >"$d/shim_full.txt" 2>"$d/shim_full.err"
  local rf=$?
  echo "bare: $(cat "$d/bare_query.txt") (rc $rb); shim: $(cat "$d/shim_query.txt") (rc $rq); plain nvidia-smi rc $rf:"
  head -n 12 "$d/shim_full.txt"
  "$PY" "$CAPS/caps_check.py" smi --dir "$d" --cap-bytes "$CAP_BYTES" --rc-bare "$rb" --rc-query "$rq" \
    --rc-full "$rf" --summary "$SUMMARY"
}

main() {
  echo "gpuguard cap validation, repo $ROOT, work $WORK, out $OUT, cap $CAP, budget ${BUDGET}s"
  record_env
  if [ ! -f "$LIB" ]; then
    echo "FATAL: $LIB missing (carry target/release/libgpuguard.so)"
  fi
  local real_total frac=0.03 frac_bytes=""
  real_total=$(env -u LD_PRELOAD "$PY" "$CAPS/caps_common.py" real-total 2>/dev/null | tail -n 1)
  if [[ "$real_total" =~ ^[0-9]+$ ]]; then
    # The same arithmetic as gpuguard: (total as f64 * f) as u64, rounded down to the
    # driver's 2 MiB page (crates/core/src/cap.rs, Limit::resolve).
    frac_bytes=$("$PY" -c "import sys; b = int(float(sys.argv[1]) * float(sys.argv[2])); p = 2 << 20; print(b // p * p if b >= p else b)" "$real_total" "$frac")
  fi

  run_smi
  run_cap driver 40 yes "$CAP" "$CAP_BYTES" -- -- "$PY" "$CAPS/driver_caps.py"
  run_cap torch_default 80 yes "$CAP" "$CAP_BYTES" -- PYTORCH_CUDA_ALLOC_CONF= -- "$PY" "$CAPS/torch_caps.py"
  run_cap torch_expandable 80 yes "$CAP" "$CAP_BYTES" -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
    "$PY" "$CAPS/torch_caps.py"
  run_cap torch_async 80 yes "$CAP" "$CAP_BYTES" -- PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- \
    "$PY" "$CAPS/torch_caps.py"
  run_cap jax_prealloc 90 any "$CAP" "$CAP_BYTES" -- -- "$PY" "$CAPS/jax_caps.py"
  run_cap cupy 60 yes "$CAP" "$CAP_BYTES" -- -- "$PY" "$CAPS/cupy_caps.py"
  run_cap jax_platform 90 yes "$CAP" "$CAP_BYTES" -- XLA_PYTHON_CLIENT_ALLOCATOR=platform -- "$PY" "$CAPS/jax_caps.py"
  run_cap driver_perdevice 40 yes "0:$CAP" "$CAP_BYTES" -- -- "$PY" "$CAPS/driver_caps.py"
  if [ -n "$frac_bytes" ]; then
    run_cap driver_fraction 40 yes "$frac" "$frac_bytes" -- -- "$PY" "$CAPS/driver_caps.py"
  else
    echo "driver_fraction not run: the real device size could not be read ($real_total)"
  fi

  section "pack"
  cp "$WORK/env.txt" "$WORK/runs/" 2>/dev/null
  tar -C "$WORK" -czf "$OUT/caps_runs.tar.gz" runs summary.jsonl 2>/dev/null
  local sz
  sz=$(stat -c %s "$OUT/caps_runs.tar.gz" 2>/dev/null || echo 0)
  if [ "$sz" -gt 15000000 ]; then
    echo "caps_runs.tar.gz is $sz bytes: repacking without exit reports"
    tar -C "$WORK" -czf "$OUT/caps_runs.tar.gz" --exclude='*.exit.json' runs summary.jsonl
  fi
  ls -l "$OUT"

  section "summary (cap $CAP = $CAP_BYTES bytes)"
  "$PY" "$CAPS/caps_check.py" table --summary "$SUMMARY" --out "$OUT/caps_summary.json" --env "$WORK/env.txt"
  local trc=$?
  echo "total time $(($(date +%s) - START))s"
  return "$trc"
}

main 2>&1 | tee "$OUT/caps.log"
exit "${PIPESTATUS[0]}"
