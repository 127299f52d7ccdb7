# Suite "caps" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh): memory
# caps (GPUGUARD_CAP). Needs libnvidia-ml.so.1 (NVML, through ctypes: pynvml not needed).
#
# Each workload runs as
#   LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_CAP=<cap> GPUGUARD_DIR=<run>/reports
# while caps_monitor.py, started WITHOUT LD_PRELOAD, samples the GPU from outside
# every 50 ms through NVML (per-process used memory, and the device's). The
# workload prints GGV_BASELINE after CUDA init and before its first allocation and
# holds still, so the monitor sees the context's baseline; caps_check.py then
# reports max(real - baseline) against the cap, the workload's own PASS/FAIL
# lines, the cap reports (denial), that no refusal was reported as the driver's (no
# oom report), and the exit report (cap_bytes, peak, denied,
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
# Knobs: GGV_CAP_GIB (default 4), GGV_CAPS_BUDGET_S (seconds for the workloads, default
# 320), GGV_ONLY (workload names), GGV_MONITOR_INTERVAL (default 0.05).

CAPS=$ROOT/scripts/gpu/caps
CAP_GIB=${GGV_CAP_GIB:-4}
CAP="${CAP_GIB}GiB"
CAP_BYTES=$((CAP_GIB << 30))
INTERVAL=${GGV_MONITOR_INTERVAL:-0.05}

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
  parse_env_cmd "$@"
  wanted "$name" || return 0
  local d=$SW/runs/$name
  mkdir -p "$d/reports"
  section "$name"
  local left
  left=$(left_s)
  if [ "$left" -lt "$tmo" ]; then tmo=$left; fi
  if [ "$tmo" -lt 20 ]; then
    echo "SKIPPED: time budget spent (${left}s left)"
    "$PY" "$CAPS/caps_check.py" run --name "$name" --dir "$d" --rc -1 --cap-bytes "$bytes" \
      --summary "$SUMMARY" >/dev/null
    return 0
  fi
  echo "cmd: GPUGUARD_CAP=$spec (expect $bytes bytes) ${ENVS[*]} ${CMD[*]} (timeout ${tmo}s)"
  start_monitor "$d"
  local t0 rc el
  t0=$(date +%s.%N)
  timeout -k 10 "$tmo" env "${ENVS[@]}" GGV_WORKLOAD="$name" GGV_CAP_BYTES="$bytes" \
    LD_PRELOAD="$LIB" GPUGUARD_CAP="$spec" GPUGUARD_DIR="$d/reports" "${CMD[@]}" >"$d/stdout.log" 2>"$d/stderr.log"
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
  wanted "$name" || return 0
  local d=$SW/runs/$name
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

suite_caps() {
  suite_begin caps 320
  echo "cap: GPUGUARD_CAP=$CAP ($CAP_BYTES bytes)"
  grep -aq GPUGUARD_CAP "$LIB" 2>/dev/null || echo "NO GPUGUARD_CAP in $LIB: this libgpuguard.so predates caps"
  local real_total frac=0.03 frac_bytes=""
  real_total=$(env -u LD_PRELOAD "$PY" "$CAPS/caps_common.py" real-total 2>/dev/null | tail -n 1)
  echo "real device size (cuDeviceTotalMem_v2, no shim): $real_total" | tee "$SW/runs/real_total.txt"
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

  section "caps: table (cap $CAP = $CAP_BYTES bytes)"
  "$PY" "$CAPS/caps_check.py" table --summary "$SUMMARY" --out "$SW/caps_summary.json"
}
