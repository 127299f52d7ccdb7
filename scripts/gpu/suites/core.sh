# Suite "core" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh): the
# framework workloads, the CUDA C paths program, the cudarc client, inert processes.
#
# For each workload it runs the program under
#   LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=<run dir>/reports
# sends SIGUSR1 from outside once the program prints "GGV_MIDRUN pid=N" (the
# program then waits, idle, for the signal report), waits for it to end, and
# checks (scripts/gpu/check_run.py): exit status 0, a signal and an exit report,
# the program's comparison lines (gpuguard vs the framework's own count), LEAK
# lines found in the exit report; then renders the exit report with
# `gpuguard show` (first 40 lines). The suite's table closes its part of the log.
# Needs target/release/examples/cudarc_client carried as well, nvcc for alloc_paths.cu.
#
# Each workload first runs bare (its "bare twin", without gpuguard): a line on the
# guarded run's stderr that is not gpuguard's and that the twin did not print fails it.
#
# Knobs: GGV_CORE_BUDGET_S (default 470), GGV_ONLY (workload names), GGV_TORCH_STEPS,
# GGV_JAX_STEPS (passed to the workloads), GGV_BARE_TWIN=0 (no bare twins).

FW=$ROOT/scripts/gpu/frameworks
CHECK=$ROOT/scripts/gpu/check_run.py

# Sends SIGUSR1 to the pid a workload announces with "GGV_MIDRUN pid=N".
signal_when_ready() {
  local log=$1 dir=$2 i pid
  for ((i = 0; i < 3000; i++)); do
    pid=$(grep -m1 -o 'GGV_MIDRUN pid=[0-9]*' "$log" 2>/dev/null | head -n1 | cut -d= -f2)
    if [ -n "$pid" ]; then
      sleep 0.3
      if kill -USR1 "$pid" 2>/dev/null; then
        echo "$(date +%s.%N) sent SIGUSR1 to $pid" >"$dir/signal_sent.txt"
      else
        echo "$(date +%s.%N) kill -USR1 $pid failed" >"$dir/signal_sent.txt"
      fi
      return 0
    fi
    sleep 0.1
  done
}

# run_workload NAME KIND TIMEOUT SIGNAL(runner|self|none) -- ENV... -- CMD...
run_workload() {
  local name=$1 kind=$2 tmo=$3 sig=$4
  shift 4
  parse_env_cmd "$@"
  wanted "$name" || return 0
  local d=$SW/runs/$name
  mkdir -p "$d/reports"
  section "$name"
  local left
  left=$(left_s)
  if [ "$left" -lt "$tmo" ]; then tmo=$left; fi
  if [ "$tmo" -lt 15 ]; then
    echo "SKIPPED: time budget spent (${left}s left)"
    "$PY" "$CHECK" run --name "$name" --kind "$kind" --dir "$d" --rc -1 --summary "$SUMMARY" >/dev/null
    return 0
  fi
  local sigenv=(GGV_EXPECT_SIGNAL=1)
  [ "$sig" = self ] && sigenv=(GGV_SIGNAL_SELF=1)
  [ "$sig" = none ] && sigenv=()
  echo "cmd: ${ENVS[*]} ${CMD[*]} (timeout ${tmo}s, signal: $sig)"
  if [ "${GGV_BARE_TWIN:-1}" != 0 ]; then
    # The same command without gpuguard (and without the signal handshake): the
    # stderr lines it prints are the program's own; check_run.py fails the run on
    # any other line of the guarded run's stderr that is not gpuguard's.
    mkdir -p "$d/bare"
    timeout -k 10 "$tmo" env "${ENVS[@]}" "${CMD[@]}" >"$d/bare/stdout.log" 2>"$d/bare/stderr.log"
    echo "bare twin: exit status $?, $(wc -l <"$d/bare/stderr.log") stderr lines"
    # The twin's time comes out of the suite's budget too.
    left=$(left_s)
    if [ "$left" -lt "$tmo" ]; then tmo=$left; fi
  fi
  local t0 rc spid=
  t0=$(date +%s.%N)
  timeout -k 10 "$tmo" env "${ENVS[@]}" "${sigenv[@]}" \
    LD_PRELOAD="$LIB" GPUGUARD_DIR="$d/reports" "${CMD[@]}" >"$d/stdout.log" 2>"$d/stderr.log" &
  local wpid=$!
  if [ "$sig" = runner ]; then
    signal_when_ready "$d/stdout.log" "$d" &
    spid=$!
  fi
  wait "$wpid"
  rc=$?
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
  local el
  el=$(since "$t0")
  echo "exit status $rc after ${el}s; $( [ -f "$d/signal_sent.txt" ] && cat "$d/signal_sent.txt" || echo 'no SIGUSR1 sent by the runner')"
  echo "--- stderr (gpuguard lines and last lines)"
  grep -a 'gpuguard' "$d/stderr.log" | head -n 20
  echo "--- stderr (last other lines)"
  grep -av 'gpuguard' "$d/stderr.log" | tail -n 8
  "$PY" "$CHECK" run --name "$name" --kind "$kind" --dir "$d" --rc "$rc" --elapsed "$el" --summary "$SUMMARY"
  local exitrep
  exitrep=$(cat "$d/exit_report_path.txt" 2>/dev/null)
  if [ -n "$exitrep" ] && [ -x "$CLI" ]; then
    echo "--- gpuguard show $(basename "$exitrep") (first 40 lines)"
    "$CLI" show "$exitrep" >"$d/show.txt" 2>&1
    echo "(gpuguard show exit status $?)" >>"$d/show.txt"
    head -n 40 "$d/show.txt"
  fi
}

build_alloc_paths() {
  section "build alloc_paths (nvcc)"
  local src=$ROOT/scripts/gpu/alloc_paths.cu variant flags
  mkdir -p "$SW/bin"
  for variant in static shared; do
    flags=()
    [ "$variant" = shared ] && flags=(-cudart shared)
    if ! nvcc -O2 "${flags[@]}" -o "$SW/bin/alloc_paths_$variant" "$src" -lcuda -ldl \
      >"$SW/build_alloc_paths_$variant.log" 2>&1; then
      # Fallback: name the usual driver stub/library folders explicitly.
      nvcc -O2 "${flags[@]}" -o "$SW/bin/alloc_paths_$variant" "$src" \
        -L/usr/local/cuda/lib64/stubs -L/usr/local/cuda/targets/x86_64-linux/lib/stubs \
        -L/usr/local/nvidia/lib64 -lcuda -ldl >>"$SW/build_alloc_paths_$variant.log" 2>&1
    fi
    if [ -x "$SW/bin/alloc_paths_$variant" ]; then
      echo "built alloc_paths_$variant"
    else
      echo "BUILD FAILED alloc_paths_$variant:"
      tail -n 20 "$SW/build_alloc_paths_$variant.log"
    fi
  done
}

suite_core() {
  suite_begin core 470
  build_alloc_paths

  section "inert: processes that never call CUDA"
  mkdir -p "$SW/runs/inert/reports"
  (
    export LD_PRELOAD=$LIB GPUGUARD_DIR=$SW/runs/inert/reports
    /bin/true; echo "/bin/true rc=$?"
    nvidia-smi -L >/dev/null; echo "nvidia-smi -L rc=$?"
    "$PY" -c 'print("python without CUDA ok")'; echo "python rc=$?"
  ) >"$SW/runs/inert/stdout.log" 2>"$SW/runs/inert/stderr.log"
  cat "$SW/runs/inert/stdout.log"
  local irc
  irc=$(grep -c 'rc=[1-9]' "$SW/runs/inert/stdout.log")
  "$PY" "$CHECK" run --name inert --kind inert --dir "$SW/runs/inert" --rc "$irc" --summary "$SUMMARY"

  # Short, deterministic programs first, then the frameworks.
  run_workload alloc_paths_static leaks 60 runner -- -- "$SW/bin/alloc_paths_static"
  run_workload alloc_paths_shared leaks 60 self -- -- "$SW/bin/alloc_paths_shared"
  run_workload cudarc_client leaks 60 runner -- -- "$CLIENT"
  run_workload torch_default framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF= -- "$PY" "$FW/torch_train.py"
  run_workload torch_expandable framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
    "$PY" "$FW/torch_train.py"
  run_workload torch_async framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- \
    "$PY" "$FW/torch_train.py"
  run_workload jax_prealloc framework 90 runner -- XLA_PYTHON_CLIENT_PREALLOCATE=true -- "$PY" "$FW/jax_work.py"
  run_workload jax_ondemand framework 90 runner -- XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$PY" "$FW/jax_work.py"
  run_workload cupy framework 90 runner -- -- "$PY" "$FW/cupy_work.py"

  cp "$SW"/build_alloc_paths_*.log "$SW/runs/" 2>/dev/null
  section "core: table"
  "$PY" "$CHECK" table --summary "$SUMMARY" --out "$SW/core_summary.json"
}
