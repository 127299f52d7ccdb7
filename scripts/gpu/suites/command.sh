# Suite "command" of scripts/gpu/validate.sh (sourced; runs with lib/common.sh): the
# gpuguard command around a real training run (issue 13, "done means", GPU part).
#
# One run, about 90 s in all:
#   gpuguard run --cap 20GiB --trace <run>/trace.json --dir <run>/reports -- \
#     python3 scripts/gpu/command/cmd_train.py
# with GPUGUARD_SNAPSHOT_EVERY=2s and PyTorch's default allocator: a small MLP trains
# for GGV_CMD_SECONDS (75) and keeps one 8 MiB tensor every 0.25 s at the line marked
# GGV_LEAK_LINE. When it prints GGV_CMD_READY (16 s of leaking), this script, from
# outside: `gpuguard ps --json` (and the table), `gpuguard show --leaks` (text and
# --json) over the snapshots written since the leaking began, `gpuguard trim PID`.
# After it ends: `gpuguard plot trace.json -o mem.svg`, `gpuguard flamegraph <exit
# report> -o leaks.html`. scripts/gpu/command/cmd_check.py judges it all (one row per
# check, group "command", workload "torch_train"):
#   ps lists the pid with live bytes > 0 and the 20 GiB cap; the leak line is the first
#   suspected leak of show --leaks; trim exits 0, writes a trim report, prints released
#   bytes > 0; run's own summary on stderr names the leak line; run exits 0 (the
#   workload's status); mem.svg is SVG with one device's live line and a cap line;
#   leaks.html names the leak file:line.
# mem.svg and leaks.html are copied to $OUT as they are (they come back as files);
# everything else is in runs.tar.gz (runs of command/).
#
# Knobs: GGV_COMMAND_BUDGET_S (default 240: the run's timeout and the checks),
# GGV_CMD_SECONDS / GGV_CMD_READY_S / GGV_LEAK_MIB / GGV_LEAK_EVERY_S /
# GGV_CMD_BAIT_MIB (the workload's, see scripts/gpu/command/cmd_train.py),
# GGV_COMMAND_WORKLOAD=stand-in: the same suite on a machine without a GPU, over
# tests/python/fakefw's stand-in `torch` and the simulated driver; needs
# GGV_SIM_DIR=<folder of `sh tests/sim/build.sh DIR`> (the workload then runs 30 s
# unless GGV_CMD_SECONDS says otherwise). Only for checking this suite itself.

CMDW=$ROOT/scripts/gpu/command

# cmd_live RUNDIR JOBPID: what a user does while the training runs.
cmd_live() {
  local d=$1 job=$2 pid snaps
  if ! wait_line "$d/stdout.log" GGV_CMD_LEAKING "$job" 180 >/dev/null; then
    echo "$(stamp) no GGV_CMD_LEAKING line" >>"$d/actions.txt"
    return 0
  fi
  touch "$d/leaking.stamp"
  echo "$(stamp) leaking" >>"$d/actions.txt"
  if ! pid=$(wait_line "$d/stdout.log" GGV_CMD_READY "$job" 120); then
    echo "$(stamp) no GGV_CMD_READY line" >>"$d/actions.txt"
    return 0
  fi
  echo "$pid" >"$d/pid.txt"
  echo "$(stamp) ready pid $pid" >>"$d/actions.txt"
  timeout -k 5 20 "$CLI" ps --json >"$d/ps.json" 2>"$d/ps.err"
  echo $? >"$d/ps.rc"
  timeout -k 5 20 "$CLI" ps >"$d/ps.txt" 2>&1
  echo "$(stamp) ps rc $(cat "$d/ps.rc")" >>"$d/actions.txt"
  # The snapshots written since the leaking began (those before CUDA started, or
  # before the trim bait, would show set-up as growth).
  find "$d/reports" -name "gpuguard.*.$pid.*.snapshot.json" -newer "$d/leaking.stamp" | sort >"$d/snapshots_live.txt"
  mapfile -t snaps <"$d/snapshots_live.txt"
  echo "$(stamp) ${#snaps[@]} snapshots since leaking" >>"$d/actions.txt"
  if [ "${#snaps[@]}" -gt 0 ]; then
    timeout -k 5 30 "$CLI" show --leaks "${snaps[@]}" >"$d/show_leaks.txt" 2>"$d/show_leaks.err"
    echo $? >"$d/show_leaks.rc"
    timeout -k 5 30 "$CLI" show --leaks --json "${snaps[@]}" >"$d/show_leaks.json" 2>>"$d/show_leaks.err"
    echo $? >"$d/show_leaks_json.rc"
  fi
  echo "$(stamp) gpuguard trim $pid" >>"$d/actions.txt"
  timeout -k 5 40 "$CLI" trim "$pid" >"$d/trim.out" 2>"$d/trim.err"
  echo $? >"$d/trim.rc"
  echo "$(stamp) trim rc $(cat "$d/trim.rc")" >>"$d/actions.txt"
  ls -l "$d/reports" >"$d/reports_after_trim.txt" 2>&1
}

suite_command() {
  suite_begin command 240
  local d=$SW/runs/command/torch_train extra=() tmo t0 rc apid
  mkdir -p "$d/reports"
  : >"$d/actions.txt"
  if [ "${GGV_COMMAND_WORKLOAD:-torch}" = stand-in ]; then
    if [ ! -e "${GGV_SIM_DIR:-}/libcudart.so.13" ]; then
      echo "GGV_COMMAND_WORKLOAD=stand-in needs GGV_SIM_DIR (sh tests/sim/build.sh DIR)"
      echo '{"group": "command", "workload": "torch_train", "check": "stand_in", "status": "FAIL", "detail": "GGV_SIM_DIR unset or not built", "data": {}}' >>"$SUMMARY"
      return 0
    fi
    extra=(GGV_COMMAND_WORKLOAD=stand-in "PYTHONPATH=$ROOT/tests/python/fakefw${PYTHONPATH:+:$PYTHONPATH}"
      "LD_LIBRARY_PATH=$GGV_SIM_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "SIMCUDA_MEM=$((141 << 30))"
      "GGV_CMD_SECONDS=${GGV_CMD_SECONDS:-30}" "GGV_CMD_READY_S=${GGV_CMD_READY_S:-10}")
    section "command: STAND-IN workload (fake torch over the simulated driver $GGV_SIM_DIR), not a GPU run"
  else
    section "command: PyTorch training under gpuguard run --cap 20GiB --trace (ps, show --leaks, trim while it runs)"
  fi
  # gpuguard run finds the library beside itself; another build is named to it.
  [ "$LIB" != "$(dirname "$CLI")/libgpuguard.so" ] && extra+=("GPUGUARD_LIB=$LIB")
  tmo=$(left_s)
  [ "$tmo" -gt 200 ] && tmo=200
  if [ "$tmo" -lt 60 ]; then
    echo "command: SKIPPED (time budget spent, ${tmo}s left)"
    echo -1 >"$d/rc.txt"
  else
    t0=$(stamp)
    timeout -k 5 "$tmo" env "${extra[@]}" GPUGUARD_SNAPSHOT_EVERY=2s "$CLI" run --cap 20GiB \
      --trace "$d/trace.json" --dir "$d/reports" -- "$PY" "$CMDW/cmd_train.py" >"$d/stdout.log" 2>"$d/stderr.log" &
    local job=$!
    cmd_live "$d" "$job" &
    apid=$!
    wait "$job"
    rc=$?
    wait "$apid" 2>/dev/null
    echo "$rc" >"$d/rc.txt"
    since "$t0" >"$d/elapsed.txt"
    echo "gpuguard run: rc $rc after $(cat "$d/elapsed.txt")s (timeout ${tmo}s); reports: $(cd "$d/reports" && ls | sed -E 's/.*\.([a-z]+)\.json$/\1/' | sort | uniq -c | tr -s ' \n' ' ')"
    echo "--- actions"; cat "$d/actions.txt"
    echo "--- gpuguard ps (while it ran)"; head -n 5 "$d/ps.txt" 2>/dev/null | cut -c1-200
    echo "--- gpuguard show --leaks (snapshots since leaking began)"; head -n 12 "$d/show_leaks.txt" 2>/dev/null | cut -c1-200
    echo "--- gpuguard trim"; head -n 8 "$d/trim.out" 2>/dev/null | cut -c1-200; head -n 3 "$d/trim.err" 2>/dev/null | cut -c1-200
    echo "--- gpuguard run's summary (stderr, without the library's own lines)"
    grep -av '^gpuguard\[' "$d/stderr.log" | tail -n 20 | cut -c1-200
    local exitrep
    exitrep=$(find "$d/reports" -name 'gpuguard.*.exit.json' | sort | tail -n 1)
    echo "$exitrep" >"$d/exit_report.txt"
    timeout -k 5 60 "$CLI" plot "$d/trace.json" -o "$d/mem.svg" >"$d/plot.out" 2>&1
    echo $? >"$d/plot.rc"
    if [ -n "$exitrep" ]; then
      timeout -k 5 60 "$CLI" flamegraph "$exitrep" -o "$d/leaks.html" >"$d/flamegraph.out" 2>&1
      echo $? >"$d/flamegraph.rc"
    fi
    echo "plot rc $(cat "$d/plot.rc"), flamegraph rc $(cat "$d/flamegraph.rc" 2>/dev/null || echo 'not run (no exit report)')"
  fi
  timeout 60 "$PY" "$CMDW/cmd_check.py" --dir "$d" --summary "$SUMMARY"
  # The two pictures come back as files of their own (docs/img/ after the run).
  [ -f "$d/mem.svg" ] && cp "$d/mem.svg" "$OUT/mem.svg"
  [ -f "$d/leaks.html" ] && cp "$d/leaks.html" "$OUT/leaks.html"
  section "command: table"
  timeout 60 "$PY" "$GGV_PY" table --summary "$SUMMARY" --txt "$SW/command_summary.txt" \
    --title "the gpuguard command around a PyTorch training run (issue 13)"
  return 0
}
