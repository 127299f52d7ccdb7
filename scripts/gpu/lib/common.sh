# Shared shell helpers of the GPU validation; sourced by scripts/gpu/validate.sh (and,
# through it, by scripts/gpu/suites/*.sh). Needs ROOT set to the repository root.
#
# Paths:   LIB CLI CLIENT (built elsewhere and carried: target/release/...), PY, WORK
#          (scratch, default /tmp/ggv), OUT (what comes back).
# Budget:  START and BUDGET of the running suite (suite_begin sets them); left_s says
#          how many seconds the suite has left; every timeout is cut to it.

LIB=${GGV_LIB:-$ROOT/target/release/libgpuguard.so}
# bench-train's build: one with the books' switch (scripts/bench/build_bench_lib.sh);
# GGV_LIB, where given, names the build to measure (run_async_split.sh's timing and
# base builds), which must have the switch too.
BENCH_LIB=${GGV_BENCH_LIB:-${GGV_LIB:-$ROOT/target/bench-lib/release/libgpuguard.so}}
CLI=${GGV_CLI:-$ROOT/target/release/gpuguard}
CLIENT=${GGV_CLIENT:-$ROOT/target/release/examples/cudarc_client}
PY=${PYTHON:-python3}
GGV_PY=$ROOT/scripts/gpu/lib/ggv.py
START=${START:-$(date +%s)}
BUDGET=${BUDGET:-600}

# Start from gpuguard's and the frameworks' defaults: no inherited GPUGUARD_* setting (a
# report signal set to USR2, a snapshot interval, a cap...), allocator setting or
# preload may change what is validated. GPUGUARD_LOG is passed through (default info).
ggv_clean_env() {
  local v
  for v in $(compgen -e | grep '^GPUGUARD_'); do
    [ "$v" = GPUGUARD_LOG ] || unset "$v"
  done
  export GPUGUARD_LOG=${GPUGUARD_LOG:-info}
  unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR \
    XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION CUBLAS_WORKSPACE_CONFIG
  # Keep NVLink multicast off (machine rule), whatever a framework would do.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
}

section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$(($(date +%s) - START))"; }
stamp() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN{printf "%.1f", b-a}'; }
left_s() { echo $((START + BUDGET - $(date +%s))); }
# wanted NAME: true unless GGV_ONLY (space-separated run names) leaves NAME out.
wanted() { [ -z "${GGV_ONLY:-}" ] || [[ " $GGV_ONLY " == *" $1 "* ]]; }

# suite_begin NAME DEFAULT_BUDGET_S: the suite's scratch folder ($SW, $SW/runs), its
# summary file ($SUMMARY), its clock (START) and budget (BUDGET: GGV_<NAME>_BUDGET_S or
# the default, cut to what the whole run has left: validate.sh's TOTAL_END).
suite_begin() {
  local name=$1 def=$2 var
  var=GGV_$(echo "$name" | tr 'a-z-' 'A-Z_')_BUDGET_S
  SW=$WORK/$name
  mkdir -p "$SW/runs"
  SUMMARY=$SW/summary.jsonl
  [ -f "$SUMMARY" ] || : >"$SUMMARY"
  START=$(date +%s)
  BUDGET=${!var:-$def}
  local total_left=$((TOTAL_END - START))
  [ "$BUDGET" -gt "$total_left" ] && BUDGET=$total_left
  [ "$BUDGET" -lt 0 ] && BUDGET=0
  section "suite $name: budget ${BUDGET}s (${var}; ${total_left}s left of GGV_BUDGET_S)"
}

# torch_conf MODE: PYTORCH_CUDA_ALLOC_CONF of an allocator mode (default, expandable,
# cudaMallocAsync), as scripts/gpu/lib/ggv.py's torch_alloc_mode reads it back.
torch_conf() {
  case $1 in
    expandable) echo expandable_segments:True ;;
    cudaMallocAsync) echo backend:cudaMallocAsync ;;
    *) echo ;;
  esac
}

# wait_line FILE WORD JOBPID MAX_S: prints N of the first "WORD pid=N" in FILE; fails
# when the job ends or MAX_S passes first.
wait_line() {
  local f=$1 word=$2 job=$3 max=$4 i pid
  for ((i = 0; i < max * 10; i++)); do
    pid=$(grep -a -m1 -o "$word pid=[0-9]*" "$f" 2>/dev/null | head -n1 | cut -d= -f2)
    if [ -n "$pid" ]; then echo "$pid"; return 0; fi
    kill -0 "$job" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# parse_env_cmd "$@": splits "-- ENV... -- CMD..." into the arrays ENVS and CMD.
parse_env_cmd() {
  ENVS=()
  CMD=()
  [ "${1:-}" = "--" ] && shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do ENVS+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  CMD=("$@")
}

# The machine, the toolchain and the artefacts, once per validate.sh run: $WORK/env.txt.
record_env() {
  section "environment"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "uname: $(uname -srm)"
    echo "--- nvidia-smi -L"; timeout 30 nvidia-smi -L 2>&1
    echo "--- driver / memory"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
    echo "--- compute processes before the run"
    timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
    echo "--- nvcc"; timeout 30 nvcc --version 2>&1 | tail -2
    echo "--- python"
    timeout 90 "$PY" - <<'PYEOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "jax", "jaxlib", "cupy", "numpy"):
    try:
        mod = importlib.import_module(m)
        extra = " cuda=%s" % mod.version.cuda if m == "torch" else ""
        print(m, getattr(mod, "__version__", "?") + extra)
    except Exception as e:  # noqa: BLE001
        print(m, "NOT AVAILABLE:", repr(e)[:200])
PYEOF
    echo "--- artefacts"
    for f in "$LIB" "$CLI" "$CLIENT"; do
      if [ -e "$f" ]; then ls -l "$f"; sha256sum "$f"; else echo "MISSING $f"; fi
    done
    echo "--- gpuguard CLI"; timeout 10 "$CLI" --version 2>&1 | head -3
    echo "--- shim version through ctypes"
    LD_PRELOAD=$LIB GPUGUARD_DIR=$WORK/probe timeout 30 "$PY" -c '
import ctypes
lib = ctypes.CDLL(None)
try:
    f = lib.gpuguard_version; f.restype = ctypes.c_char_p; print("gpuguard_version:", f().decode())
except AttributeError:
    print("gpuguard_version: symbol not found")' 2>&1
    echo "--- what the build knows"
    for s in GPUGUARD_CAP GPUGUARD_TRIM_SIGNAL python_sites classification; do
      if grep -aq "$s" "$LIB" 2>/dev/null; then echo "libgpuguard.so: $s yes"; else echo "libgpuguard.so: $s NO"; fi
    done
    if timeout 10 "$CLI" --help 2>&1 | grep -q 'trim'; then echo "gpuguard CLI: trim yes"; else echo "gpuguard CLI: trim NO"; fi
  } 2>&1 | tee "$WORK/env.txt"
  [ -f "$LIB" ] || echo "FATAL: $LIB missing (carry target/release/libgpuguard.so)"
  [ -x "$CLI" ] || echo "WARNING: $CLI missing (carry target/release/gpuguard)"
}
