#!/usr/bin/env bash
# gpuguard GPU validation: the one command for the GPU machine.
#
#   bash scripts/gpu/validate_core.sh            (from the repository root)
#
# Needs, in the repo copy: target/release/libgpuguard.so, target/release/gpuguard,
# target/release/examples/cudarc_client (built elsewhere, carried over). On the
# machine: python3 with torch/jax/cupy, nvcc, nvidia-smi.
#
# For each workload it runs the program under
#   LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=<run dir>/reports
# sends SIGUSR1 from outside once the program prints "GGV_MIDRUN pid=N" (the
# program then waits, idle, for the signal report), waits for it to end, and
# checks (scripts/gpu/check_run.py): exit status 0, a signal and an exit report,
# the program's comparison lines (gpuguard vs the framework's own count), LEAK
# lines found in the exit report; then renders the exit report with
# `gpuguard show` (first 40 lines). A summary table closes the log.
#
# Results go to $OUT (3 files): validate.log (this console), summary.json (one
# row per workload plus the environment), runs.tar.gz (every run's stdout,
# stderr, reports and show output; build logs; env.txt).
#
# Knobs: GGV_BUDGET_S (total seconds for the workloads, default 470),
# GGV_ONLY (space-separated workload names to run), GPUGUARD_LOG (default info),
# GGV_TORCH_STEPS, GGV_JAX_STEPS (passed to the workloads).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/ggv-out}
mkdir -p "$OUT"
WORK=${GGV_WORK:-/tmp/ggv}
rm -rf "$WORK"
mkdir -p "$WORK/bin"
SUMMARY=$WORK/summary.jsonl
: >"$SUMMARY"

LIB=$ROOT/target/release/libgpuguard.so
CLI=$ROOT/target/release/gpuguard
CLIENT=$ROOT/target/release/examples/cudarc_client
PY=${PYTHON:-python3}
FW=$ROOT/scripts/gpu/frameworks
CHECK=$ROOT/scripts/gpu/check_run.py
START=$(date +%s)
BUDGET=${GGV_BUDGET_S:-470}
export GPUGUARD_LOG=${GPUGUARD_LOG:-info}
# Keep NVLink multicast off (machine rule), whatever a framework would do.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$(($(date +%s) - START))"; }

record_env() {
  section "environment"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "uname: $(uname -srm)"
    echo "--- nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "--- driver / memory"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
    echo "--- nvcc"; nvcc --version 2>&1 | tail -2
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
    for f in "$LIB" "$CLI" "$CLIENT"; do
      if [ -e "$f" ]; then ls -l "$f"; sha256sum "$f"; else echo "MISSING $f"; fi
    done
    echo "--- gpuguard CLI"; "$CLI" --version 2>&1 | head -3
    echo "--- shim version through ctypes"
    LD_PRELOAD=$LIB GPUGUARD_DIR=$WORK/probe "$PY" -c '
import ctypes
lib = ctypes.CDLL(None)
try:
    f = lib.gpuguard_version; f.restype = ctypes.c_char_p; print("gpuguard_version:", f().decode())
except AttributeError:
    print("gpuguard_version: symbol not found")' 2>&1
  } 2>&1 | tee "$WORK/env.txt"
}

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
  if [ "$tmo" -lt 15 ]; then
    echo "SKIPPED: time budget spent (${left}s left)"
    "$PY" "$CHECK" run --name "$name" --kind "$kind" --dir "$d" --rc -1 --summary "$SUMMARY" >/dev/null
    return 0
  fi
  local sigenv=(GGV_EXPECT_SIGNAL=1)
  [ "$sig" = self ] && sigenv=(GGV_SIGNAL_SELF=1)
  [ "$sig" = none ] && sigenv=()
  echo "cmd: ${envs[*]} $* (timeout ${tmo}s, signal: $sig)"
  local t0 rc spid=
  t0=$(date +%s.%N)
  timeout -k 10 "$tmo" env "${envs[@]}" "${sigenv[@]}" \
    LD_PRELOAD="$LIB" GPUGUARD_DIR="$d/reports" "$@" >"$d/stdout.log" 2>"$d/stderr.log" &
  local wpid=$!
  if [ "$sig" = runner ]; then
    signal_when_ready "$d/stdout.log" "$d" &
    spid=$!
  fi
  wait "$wpid"
  rc=$?
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
  local el
  el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
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
  for variant in static shared; do
    flags=()
    [ "$variant" = shared ] && flags=(-cudart shared)
    if ! nvcc -O2 "${flags[@]}" -o "$WORK/bin/alloc_paths_$variant" "$src" -lcuda -ldl \
      >"$WORK/build_alloc_paths_$variant.log" 2>&1; then
      # Fallback: name the usual driver stub/library folders explicitly.
      nvcc -O2 "${flags[@]}" -o "$WORK/bin/alloc_paths_$variant" "$src" \
        -L/usr/local/cuda/lib64/stubs -L/usr/local/cuda/targets/x86_64-linux/lib/stubs \
        -L/usr/local/nvidia/lib64 -lcuda -ldl >>"$WORK/build_alloc_paths_$variant.log" 2>&1
    fi
    if [ -x "$WORK/bin/alloc_paths_$variant" ]; then
      echo "built alloc_paths_$variant"
    else
      echo "BUILD FAILED alloc_paths_$variant:"
      tail -n 20 "$WORK/build_alloc_paths_$variant.log"
    fi
  done
}

main() {
  echo "gpuguard GPU validation, repo $ROOT, work $WORK, out $OUT, budget ${BUDGET}s"
  record_env
  if [ ! -f "$LIB" ]; then
    echo "FATAL: $LIB missing (carry target/release/libgpuguard.so)"
  fi
  build_alloc_paths

  section "inert: processes that never call CUDA"
  mkdir -p "$WORK/runs/inert/reports"
  (
    export LD_PRELOAD=$LIB GPUGUARD_DIR=$WORK/runs/inert/reports
    /bin/true; echo "/bin/true rc=$?"
    nvidia-smi -L >/dev/null; echo "nvidia-smi -L rc=$?"
    "$PY" -c 'print("python without CUDA ok")'; echo "python rc=$?"
  ) >"$WORK/runs/inert/stdout.log" 2>"$WORK/runs/inert/stderr.log"
  cat "$WORK/runs/inert/stdout.log"
  local irc
  irc=$(grep -c 'rc=[1-9]' "$WORK/runs/inert/stdout.log")
  "$PY" "$CHECK" run --name inert --kind inert --dir "$WORK/runs/inert" --rc "$irc" --summary "$SUMMARY"

  # Short, deterministic programs first, then the frameworks.
  run_workload alloc_paths_static leaks 60 runner -- -- "$WORK/bin/alloc_paths_static"
  run_workload alloc_paths_shared leaks 60 self -- -- "$WORK/bin/alloc_paths_shared"
  run_workload cudarc_client leaks 60 runner -- -- "$CLIENT"
  run_workload torch_default framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF= -- "$PY" "$FW/torch_train.py"
  run_workload torch_expandable framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
    "$PY" "$FW/torch_train.py"
  run_workload torch_async framework 110 runner -- PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- \
    "$PY" "$FW/torch_train.py"
  run_workload jax_prealloc framework 90 runner -- XLA_PYTHON_CLIENT_PREALLOCATE=true -- "$PY" "$FW/jax_work.py"
  run_workload jax_ondemand framework 90 runner -- XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$PY" "$FW/jax_work.py"
  run_workload cupy framework 90 runner -- -- "$PY" "$FW/cupy_work.py"

  section "pack"
  cp "$WORK/env.txt" "$WORK/runs/" 2>/dev/null
  cp "$WORK"/build_alloc_paths_*.log "$WORK/runs/" 2>/dev/null
  tar -C "$WORK" -czf "$OUT/runs.tar.gz" runs summary.jsonl 2>/dev/null
  local sz
  sz=$(stat -c %s "$OUT/runs.tar.gz" 2>/dev/null || echo 0)
  if [ "$sz" -gt 15000000 ]; then
    echo "runs.tar.gz is $sz bytes: repacking without signal/request reports"
    tar -C "$WORK" -czf "$OUT/runs.tar.gz" --exclude='*.signal.json' --exclude='*.request.json' runs summary.jsonl
  fi
  ls -l "$OUT"

  section "summary"
  "$PY" "$CHECK" table --summary "$SUMMARY" --out "$OUT/summary.json" --env "$WORK/env.txt"
  local trc=$?
  echo "total time $(($(date +%s) - START))s"
  return "$trc"
}

main 2>&1 | tee "$OUT/validate.log"
exit "${PIPESTATUS[0]}"
