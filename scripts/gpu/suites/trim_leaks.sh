# Suite "trim-leaks" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh):
# trimming (issue 4) and leak reports (issue 6). Every check's row goes to the suite's
# summary.jsonl (scripts/gpu/lib/ggv.py Rows); the compact table ends its part of the log.
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
# Knobs: GGV_TRIM_LEAKS_BUDGET_S (seconds for the workloads, counted from the suite's
# start; default 320: no workload starts or runs past it, and the checks after it are
# cut short; a normal run takes about 3 minutes), GGV_ONLY (run names, e.g.
# "torch_default cupy leak_torch_default leak_cupy_lines").

TRIM=$ROOT/scripts/gpu/trim
LEAKS=$ROOT/scripts/gpu/leaks

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
  parse_env_cmd "$@"
  local d=$SW/runs/$group/$name
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
  timeout -k 5 "$tmo" env "${ENVS[@]}" GGV_RUN_DIR="$d" LD_PRELOAD="$LIB" GPUGUARD_DIR="$d/reports" "${CMD[@]}" \
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
  el=$(since "$t0")
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
    conf=$(torch_conf "$mode")
    wanted "torch_$mode" || continue
    run_job trim "torch_${mode}_nosignal" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_TRIM_ROLE=nosignal -- \
      "$PY" "$TRIM/trim_torch.py"
    run_job trim "torch_${mode}_signal" 90 act_usr2 -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_TRIM_ROLE=signal -- \
      "$PY" "$TRIM/trim_torch.py"
    check "$TRIM/trim_check.py" torch --mode "$mode" --ref "$SW/runs/trim/torch_${mode}_nosignal" \
      --dir "$SW/runs/trim/torch_${mode}_signal" --summary "$SUMMARY"
  done

  if wanted cupy; then
    section "A. trim: CuPy"
    run_job trim cupy 60 act_usr2 -- -- "$PY" "$TRIM/trim_cupy.py"
    check "$TRIM/trim_check.py" cupy --dir "$SW/runs/trim/cupy" --summary "$SUMMARY"
  fi
  if wanted jax; then
    section "A. trim: JAX (not releasable)"
    run_job trim jax 90 act_usr2 -- -- "$PY" "$TRIM/trim_jax.py"
    check "$TRIM/trim_check.py" jax --dir "$SW/runs/trim/jax" --summary "$SUMMARY"
  fi
  if wanted cli_and_burst; then
    section "A. trim: gpuguard trim PID, then a burst of 5 SIGUSR2"
    run_job trim cli_and_burst 120 act_hold -- PYTORCH_CUDA_ALLOC_CONF= GGV_TRIM_ROLE=hold -- \
      "$PY" "$TRIM/trim_torch.py"
    echo "gpuguard trim: rc $(cat "$SW/runs/trim/cli_and_burst/cli_trim.rc" 2>/dev/null); stdout:"
    head -n 5 "$SW/runs/trim/cli_and_burst/cli_trim.out" 2>/dev/null | cut -c1-200
    check "$TRIM/trim_check.py" hold --dir "$SW/runs/trim/cli_and_burst" \
      --ref "$SW/runs/trim/torch_default_nosignal" --summary "$SUMMARY"
  fi
  if wanted cli_foreign; then
    section "A. trim: gpuguard trim on a process without gpuguard"
    local d=$SW/runs/trim/cli_foreign spid
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
    conf=$(torch_conf "$mode")
    wanted "leak_torch_$mode" || continue
    run_job leaks "torch_$mode" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GGV_PREWARM_MIB=64 -- \
      "$PY" "$LEAKS/leak_torch.py"
    check "$LEAKS/leak_check.py" torch --mode "$mode" --python on --dir "$SW/runs/leaks/torch_$mode" \
      --cli "$CLI" --summary "$SUMMARY"
  done
  section "B. leak reports: PyTorch with GPUGUARD_PYTHON=lines (its recorder: block-exact lines)"
  for mode in default expandable; do
    conf=$(torch_conf "$mode")
    wanted "leak_torch_${mode}_lines" || continue
    run_job leaks "torch_${mode}_lines" 90 none -- PYTORCH_CUDA_ALLOC_CONF="$conf" GPUGUARD_PYTHON=lines \
      GGV_PREWARM_MIB=1024 -- "$PY" "$LEAKS/leak_torch.py"
    check "$LEAKS/leak_check.py" torch --mode "$mode" --python lines --dir "$SW/runs/leaks/torch_${mode}_lines" \
      --cli "$CLI" --summary "$SUMMARY"
  done
  if wanted leak_cupy; then
    section "B. leak reports: CuPy, default settings"
    run_job leaks cupy 60 none -- GGV_PREWARM_MIB=64 -- "$PY" "$LEAKS/leak_cupy.py"
    check "$LEAKS/leak_check.py" cupy --python on --dir "$SW/runs/leaks/cupy" --cli "$CLI" --summary "$SUMMARY"
  fi
  if wanted leak_cupy_lines; then
    section "B. leak reports: CuPy with GPUGUARD_PYTHON=lines (gpuguard's CuPy hook)"
    run_job leaks cupy_lines 60 none -- GPUGUARD_PYTHON=lines GGV_PREWARM_MIB=1024 -- "$PY" "$LEAKS/leak_cupy.py"
    check "$LEAKS/leak_check.py" cupy --python lines --dir "$SW/runs/leaks/cupy_lines" --cli "$CLI" \
      --summary "$SUMMARY"
  fi
  if wanted leak_jax; then
    section "B. leak reports: JAX, default settings (its device memory profile)"
    run_job leaks jax 90 none -- -- "$PY" "$LEAKS/leak_jax.py"
    check "$LEAKS/leak_check.py" jax --dir "$SW/runs/leaks/jax" --cli "$CLI" --summary "$SUMMARY"
  fi
}

suite_trim_leaks() {
  suite_begin trim-leaks 320
  # Deterministic cuBLAS for the loss comparison (trim_torch.py also sets it).
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  part_trim
  part_leaks
  section "trim-leaks: table (every check with its numbers: summary.txt)"
  timeout "$(tmo_after 95 60)" "$PY" "$GGV_PY" table --summary "$SUMMARY" --txt "$SW/trim_leaks_summary.txt" \
    --title "gpuguard trim (issue 4) and leak reports (issue 6) on the GPU"
  return 0
}
