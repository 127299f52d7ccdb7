#!/usr/bin/env bash
# gpuguard GPU validation of trimming (issue 4) and leak reports (issue 6): the one command.
#
#   OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh     (from the repository root)
#
# Needs, in the repo copy: target/release/libgpuguard.so and target/release/gpuguard
# (built elsewhere, carried over). On the machine: python3 with torch, cupy, jax;
# nvidia-smi. No network, no cargo. Always exits 0 (the verdicts are in the table).
#
# A. Trim (scripts/gpu/trim/, judged by trim_check.py). Every run is under
#    LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=<run>/reports.
#    torch_<mode> x {nosignal, signal} for mode default, expandable
#        (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and cudaMallocAsync
#        (backend:cudaMallocAsync): trim_torch.py trains a deterministic float32 MLP,
#        fills the cache with 4 GiB of dropped temporaries at step 15, prints
#        GGV_TRIM_READY; in the signal run this script sends `kill -USR2` from
#        outside. Checks: same losses (<= 1e-6 relative), a trim report (trigger
#        signal, python ran, pytorch released > 0, cuda_pools listed), the driver's
#        per-process usage (nvidia-smi) fell by >= 70% of the cache, gpuguard's
#        current_bytes within 416 MiB of memory_allocated(), the stderr trim line,
#        and the nosignal control kept its cache.
#    cupy: trim_cupy.py caches 4 GiB in CuPy's pool; USR2; pool and NVML drop.
#    jax: trim_jax.py; USR2; the report lists jax as not_releasable with advice.
#    cli_and_burst: trim_torch.py (role hold): `gpuguard trim PID` (exit 0, a
#        summary, a report), then 5 x SIGUSR2 back to back: 1-2 reports whose
#        merged counts sum to ~5, and the process trains on.
#    cli_foreign: `gpuguard trim` on a plain `sleep 30`: non-zero exit, a message.
# B. Leak reports (scripts/gpu/leaks/, judged by leak_check.py): 40 steps leaking
#    8 MiB each at a known line, SIGUSR1 sent by the workload itself after steps 10
#    and 30, the exit report at exit (from Python's atexit).
#    Default settings (GPUGUARD_PYTHON unset: no framework recorder, Python lines
#    from the allocating thread's stack, framework "python-stack"), prewarm 64 MiB:
#      leak_torch.py in the three modes (leak_torch_default, leak_torch_expandable,
#      leak_torch_cudaMallocAsync): the first site of `gpuguard diff <signal 1>
#      <signal 2>` and the first suspected leak of `gpuguard show <signal 1> <signal 2>
#      <exit>` are a Python site naming the leak line; native sites end with
#      "python: " frames; no pytorch python_sites (recorder off); current_bytes >=
#      leaked; native modes: in_use >= leaked; cudaMallocAsync: a python-stack site
#      naming the line holds >= the leaked bytes.
#      leak_cupy.py (leak_cupy): the same diff/show/frames checks, in_use >= leaked.
#      leak_jax.py (leak_jax): a python_sites entry of framework jax names the line
#      with >= the leaked bytes; in_use >= leaked; classification jax classified.
#    GPUGUARD_PYTHON=lines (the recorders on), prewarm 1024 MiB (the leak never grows
#      the cache): leak_torch.py default and expandable (leak_torch_default_lines,
#      leak_torch_expandable_lines): python_sites[0] framework pytorch names the line
#      with the leaked bytes, diff/show first site [pytorch blocks, Python];
#      leak_cupy.py (leak_cupy_lines): python_sites[0] framework cupy names the line.
#
# Results in $OUT (4 files): summary.txt (every check with its numbers, and the
# environment), summary.json (the rows with their data), trim_leaks.log (this
# console), trim_leaks_runs.tar.gz (each run's stdout, stderr, reports, CLI
# outputs, diff/show texts; env.txt). The compact PASS/FAIL table ends the console.
#
# Knobs: GGV_BUDGET_S (seconds for the workloads, counted from the start; default
# 320: no workload starts or runs past it, and the checks, packing and table after
# it are cut short, so the whole script ends within 7 minutes; a normal run takes
# about 4), GGV_ONLY (space-separated run names, e.g. "torch_default cupy
# leak_torch_default leak_cupy_lines"), GPUGUARD_LOG (default info),
# GGV_LIB / GGV_CLI (other builds), GGV_WORK (scratch directory, default /tmp/ggv-tl).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 0
OUT=${OUT:-/tmp/ggv-tl-out}
mkdir -p "$OUT"
WORK=${GGV_WORK:-/tmp/ggv-tl}
rm -rf "$WORK"
mkdir -p "$WORK/runs"
SUMMARY=$WORK/summary.jsonl
: >"$SUMMARY"

LIB=${GGV_LIB:-$ROOT/target/release/libgpuguard.so}
CLI=${GGV_CLI:-$ROOT/target/release/gpuguard}
PY=${PYTHON:-python3}
TRIM=$ROOT/scripts/gpu/trim
LEAKS=$ROOT/scripts/gpu/leaks
START=$(date +%s)
BUDGET=${GGV_BUDGET_S:-320}
# Start from gpuguard's defaults: no inherited GPUGUARD_* setting (a report signal set
# to USR2, a snapshot interval, a cap...) may change what is validated.
for v in $(compgen -e | grep '^GPUGUARD_'); do
  [ "$v" = GPUGUARD_LOG ] || unset "$v"
done
export GPUGUARD_LOG=${GPUGUARD_LOG:-info}
# Keep NVLink multicast off (machine rule), whatever a framework would do.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Deterministic cuBLAS for the loss comparison (trim_torch.py also sets it).
export CUBLAS_WORKSPACE_CONFIG=:4096:8
unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR \
  XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION

section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$(($(date +%s) - START))"; }
left_s() { echo $((START + BUDGET - $(date +%s))); }
wanted() { [ -z "${GGV_ONLY:-}" ] || [[ " $GGV_ONLY " == *" $1 "* ]]; }

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
    echo "--- python"
    timeout 90 "$PY" - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "cupy", "jax", "jaxlib", "numpy"):
    try:
        mod = importlib.import_module(m)
        extra = " cuda=%s" % mod.version.cuda if m == "torch" else ""
        print(m, getattr(mod, "__version__", "?") + extra)
    except Exception as e:  # noqa: BLE001
        print(m, "NOT AVAILABLE:", repr(e)[:200])
EOF
    echo "--- artefacts"
    for f in "$LIB" "$CLI"; do
      if [ -e "$f" ]; then ls -l "$f"; sha256sum "$f"; else echo "MISSING $f"; fi
    done
    echo "--- gpuguard CLI"; timeout 10 "$CLI" --version 2>&1 | head -3
    echo "--- the build knows trim / Python classification"
    for s in GPUGUARD_TRIM_SIGNAL python_sites classification; do
      if grep -aq "$s" "$LIB" 2>/dev/null; then echo "libgpuguard.so: $s yes"; else echo "libgpuguard.so: $s NO"; fi
    done
    if timeout 10 "$CLI" --help 2>&1 | grep -q 'trim'; then echo "gpuguard CLI: trim yes"; else echo "gpuguard CLI: trim NO"; fi
  } 2>&1 | tee "$WORK/env.txt"
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

stamp() { date +%s.%N; }

# Actions, run in the background next to a workload: ACTION RUNDIR JOBPID.
act_usr2() {
  local d=$1 job=$2 pid
  if pid=$(wait_line "$d/stdout.log" GGV_TRIM_READY "$job" 120); then
    sleep 0.2
    if kill -USR2 "$pid" 2>/dev/null; then echo "$(stamp) usr2 kill ok pid $pid" >>"$d/actions.txt"
    else echo "$(stamp) usr2 kill FAILED pid $pid" >>"$d/actions.txt"; fi
  else
    echo "$(stamp) no GGV_TRIM_READY line" >>"$d/actions.txt"
  fi
}

act_hold() {
  local d=$1 job=$2 pid i
  if ! pid=$(wait_line "$d/stdout.log" GGV_TRIM_READY "$job" 120); then
    echo "$(stamp) no GGV_TRIM_READY line" >>"$d/actions.txt"
    return 0
  fi
  sleep 0.2
  echo "$(stamp) gpuguard trim $pid" >>"$d/actions.txt"
  timeout -k 5 40 env GPUGUARD_DIR="$d/reports" "$CLI" trim "$pid" >"$d/cli_trim.out" 2>"$d/cli_trim.err"
  echo $? >"$d/cli_trim.rc"
  echo "$(stamp) gpuguard trim rc $(cat "$d/cli_trim.rc")" >>"$d/actions.txt"
  touch "$d/go_burst"
  if ! wait_line "$d/stdout.log" GGV_BURST_READY "$job" 60 >/dev/null; then
    echo "$(stamp) no GGV_BURST_READY line" >>"$d/actions.txt"
    return 0
  fi
  sleep 0.2
  local ok=()
  for i in 1 2 3 4 5; do
    if kill -USR2 "$pid" 2>/dev/null; then ok+=("$(stamp) burst kill ok"); else ok+=("$(stamp) burst kill FAILED"); fi
  done
  printf '%s\n' "${ok[@]}" >>"$d/actions.txt"
  touch "$d/burst_sent"
}

# run_job GROUP NAME TIMEOUT ACTION -- ENV... -- CMD...   (ACTION: none, act_usr2, act_hold)
run_job() {
  local group=$1 name=$2 tmo=$3 action=$4
  shift 4
  [ "${1:-}" = "--" ] && shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  local d=$WORK/runs/$group/$name
  mkdir -p "$d/reports"
  : >"$d/actions.txt"
  local left
  left=$(left_s)
  if [ "$left" -lt "$tmo" ]; then tmo=$left; fi
  if [ "$tmo" -lt 20 ]; then
    echo "$name: SKIPPED (time budget spent, ${left}s left)"
    echo -1 >"$d/rc.txt"
    return 0
  fi
  local t0 rc job apid=
  t0=$(stamp)
  timeout -k 5 "$tmo" env "${envs[@]}" GGV_RUN_DIR="$d" LD_PRELOAD="$LIB" GPUGUARD_DIR="$d/reports" "$@" \
    >"$d/stdout.log" 2>"$d/stderr.log" &
  job=$!
  if [ "$action" != none ]; then
    "$action" "$d" "$job" &
    apid=$!
  fi
  wait "$job"
  rc=$?
  if [ -n "$apid" ]; then kill "$apid" 2>/dev/null; wait "$apid" 2>/dev/null; fi
  echo "$rc" >"$d/rc.txt"
  local el
  el=$(awk -v a="$t0" -v b="$(stamp)" 'BEGIN{printf "%.1f", b-a}')
  echo "$el" >"$d/elapsed.txt"
  echo "$name: rc $rc after ${el}s (timeout ${tmo}s); reports: $(cd "$d/reports" && ls 2>/dev/null | sed -E 's/.*\.([a-z]+)\.json$/\1/' | sort | uniq -c | tr -s ' \n' ' ')"
  grep -a -m3 -E 'gpuguard(\[[0-9]+\])?: trim' "$d/stderr.log" | cut -c1-200
  if [ "$rc" -ne 0 ]; then
    echo "--- $name stderr (last lines)"; grep -av '^gpuguard\[' "$d/stderr.log" | tail -n 6 | cut -c1-240
  fi
}

# tmo_after GRACE MAX: seconds for a step after the workloads, at most MAX, cut to
# what is left of the budget plus GRACE (at least 10 s).
tmo_after() {
  local t=$((START + BUDGET + $1 - $(date +%s)))
  [ "$t" -gt "$2" ] && t=$2
  [ "$t" -lt 10 ] && t=10
  echo "$t"
}
check() { timeout "$(tmo_after 40 90)" "$PY" "$@"; }

part_trim() {
  section "A. trim: PyTorch, three allocator modes, without and with SIGUSR2"
  local mode conf
  for mode in default expandable cudaMallocAsync; do
    case $mode in
      default) conf= ;;
      expandable) conf=expandable_segments:True ;;
      cudaMallocAsync) conf=backend:cudaMallocAsync ;;
    esac
    wanted "torch_$mode" || continue
    run_job trim "torch_${mode}_nosignal" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_TRIM_ROLE=nosignal -- \
      "$PY" "$TRIM/trim_torch.py"
    run_job trim "torch_${mode}_signal" 90 act_usr2 -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_TRIM_ROLE=signal -- \
      "$PY" "$TRIM/trim_torch.py"
    check "$TRIM/trim_check.py" torch --mode "$mode" --ref "$WORK/runs/trim/torch_${mode}_nosignal" \
      --dir "$WORK/runs/trim/torch_${mode}_signal" --summary "$SUMMARY"
  done

  if wanted cupy; then
    section "A. trim: CuPy"
    run_job trim cupy 60 act_usr2 -- -- "$PY" "$TRIM/trim_cupy.py"
    check "$TRIM/trim_check.py" cupy --dir "$WORK/runs/trim/cupy" --summary "$SUMMARY"
  fi
  if wanted jax; then
    section "A. trim: JAX (not releasable)"
    run_job trim jax 90 act_usr2 -- -- "$PY" "$TRIM/trim_jax.py"
    check "$TRIM/trim_check.py" jax --dir "$WORK/runs/trim/jax" --summary "$SUMMARY"
  fi
  if wanted cli_and_burst; then
    section "A. trim: gpuguard trim PID, then a burst of 5 SIGUSR2"
    run_job trim cli_and_burst 120 act_hold -- PYTORCH_CUDA_ALLOC_CONF= GGV_TRIM_ROLE=hold -- \
      "$PY" "$TRIM/trim_torch.py"
    echo "gpuguard trim: rc $(cat "$WORK/runs/trim/cli_and_burst/cli_trim.rc" 2>/dev/null); stdout:"
    head -n 5 "$WORK/runs/trim/cli_and_burst/cli_trim.out" 2>/dev/null | cut -c1-200
    check "$TRIM/trim_check.py" hold --dir "$WORK/runs/trim/cli_and_burst" \
      --ref "$WORK/runs/trim/torch_default_nosignal" --summary "$SUMMARY"
  fi
  if wanted cli_foreign; then
    section "A. trim: gpuguard trim on a process without gpuguard"
    local d=$WORK/runs/trim/cli_foreign spid
    mkdir -p "$d"
    # A plain process (no LD_PRELOAD); it ends by itself, and is killed below.
    sleep 30 &
    spid=$!
    sleep 0.3
    timeout -k 5 20 "$CLI" trim "$spid" >"$d/cli_foreign.out" 2>"$d/cli_foreign.err"
    echo $? >"$d/cli_foreign.rc"
    if kill -0 "$spid" 2>/dev/null; then echo yes >"$d/sleep_alive.txt"; else echo no >"$d/sleep_alive.txt"; fi
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    echo "gpuguard trim <sleep pid $spid>: rc $(cat "$d/cli_foreign.rc"): $(head -c 200 "$d/cli_foreign.err") $(head -c 200 "$d/cli_foreign.out")"
    check "$TRIM/trim_check.py" foreign --dir "$d" --summary "$SUMMARY"
  fi
}

part_leaks() {
  section "B. leak reports: PyTorch, three allocator modes, default settings (Python lines from stacks)"
  local mode conf
  for mode in default expandable cudaMallocAsync; do
    case $mode in
      default) conf= ;;
      expandable) conf=expandable_segments:True ;;
      cudaMallocAsync) conf=backend:cudaMallocAsync ;;
    esac
    wanted "leak_torch_$mode" || continue
    run_job leaks "torch_$mode" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_PREWARM_MIB=64 -- \
      "$PY" "$LEAKS/leak_torch.py"
    check "$LEAKS/leak_check.py" torch --mode "$mode" --python on --dir "$WORK/runs/leaks/torch_$mode" \
      --cli "$CLI" --summary "$SUMMARY"
  done
  section "B. leak reports: PyTorch with GPUGUARD_PYTHON=lines (its recorder: block-exact lines)"
  for mode in default expandable; do
    case $mode in
      default) conf= ;;
      expandable) conf=expandable_segments:True ;;
    esac
    wanted "leak_torch_${mode}_lines" || continue
    run_job leaks "torch_${mode}_lines" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GPUGUARD_PYTHON=lines \
      GGV_PREWARM_MIB=1024 -- "$PY" "$LEAKS/leak_torch.py"
    check "$LEAKS/leak_check.py" torch --mode "$mode" --python lines --dir "$WORK/runs/leaks/torch_${mode}_lines" \
      --cli "$CLI" --summary "$SUMMARY"
  done
  if wanted leak_cupy; then
    section "B. leak reports: CuPy, default settings"
    run_job leaks cupy 60 none -- GGV_PREWARM_MIB=64 -- "$PY" "$LEAKS/leak_cupy.py"
    check "$LEAKS/leak_check.py" cupy --python on --dir "$WORK/runs/leaks/cupy" --cli "$CLI" --summary "$SUMMARY"
  fi
  if wanted leak_cupy_lines; then
    section "B. leak reports: CuPy with GPUGUARD_PYTHON=lines (gpuguard's CuPy hook)"
    run_job leaks cupy_lines 60 none -- GPUGUARD_PYTHON=lines GGV_PREWARM_MIB=1024 -- "$PY" "$LEAKS/leak_cupy.py"
    check "$LEAKS/leak_check.py" cupy --python lines --dir "$WORK/runs/leaks/cupy_lines" --cli "$CLI" \
      --summary "$SUMMARY"
  fi
  if wanted leak_jax; then
    section "B. leak reports: JAX, default settings (its device memory profile)"
    run_job leaks jax 90 none -- -- "$PY" "$LEAKS/leak_jax.py"
    check "$LEAKS/leak_check.py" jax --dir "$WORK/runs/leaks/jax" --cli "$CLI" --summary "$SUMMARY"
  fi
}

main() {
  echo "gpuguard trim + leak-report validation, repo $ROOT, work $WORK, out $OUT, budget ${BUDGET}s"
  record_env
  [ -f "$LIB" ] || echo "FATAL: $LIB missing (carry target/release/libgpuguard.so)"
  [ -x "$CLI" ] || echo "WARNING: $CLI missing (carry target/release/gpuguard)"
  part_trim
  part_leaks

  section "pack"
  cp "$WORK/env.txt" "$WORK/runs/" 2>/dev/null
  timeout "$(tmo_after 75 60)" tar -C "$WORK" -czf "$OUT/trim_leaks_runs.tar.gz" runs summary.jsonl 2>/dev/null
  local sz
  sz=$(stat -c %s "$OUT/trim_leaks_runs.tar.gz" 2>/dev/null || echo 0)
  if [ "$sz" -gt 15000000 ]; then
    echo "trim_leaks_runs.tar.gz is $sz bytes: repacking without the signal reports"
    timeout "$(tmo_after 90 60)" tar -C "$WORK" -czf "$OUT/trim_leaks_runs.tar.gz" --exclude='*.signal.json' \
      runs summary.jsonl
  fi
  ls -l "$OUT"

  section "summary (every check with its numbers: $OUT/summary.txt)"
  timeout "$(tmo_after 95 60)" "$PY" "$TRIM/tl_common.py" table --summary "$SUMMARY" --txt "$OUT/summary.txt" \
    --json "$OUT/summary.json" --env "$WORK/env.txt"
  echo "total time $(($(date +%s) - START))s"
}

main 2>&1 | tee "$OUT/trim_leaks.log"
exit 0
