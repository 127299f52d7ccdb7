# Suites "reliability", "graph", "endings", "soak", "soak-start", "soak-wait" of
# scripts/gpu/validate.sh (sourced; runs with lib/common.sh): issue 11 item 8. The
# workloads are in scripts/gpu/reliability/; rel_check.py starts them, sends the signals
# and judges (its header lists every check).
#
#   graph      PyTorch CUDA-graph capture with backend:cudaMallocAsync, SIGUSR1 and
#              SIGUSR2 arriving during the capture, replays equal to a run without
#              gpuguard                                                      (~30 s)
#   endings    SIGTERM from outside (exit status and a final report), SIGTERM to a job
#              with its own handler, SIGINT (KeyboardInterrupt; the exit status is that
#              of a bare twin run beside it, signalled the same way)        (~40 s)
#   soak       a training soak under gpuguard with SIGUSR1/SIGUSR2 every 2-3 s next to
#              the same loop without gpuguard: bit-identical losses, books equal to
#              memory_reserved() at the end, valid reports              (GGV_SOAK_S)
#   soak-start / soak-wait   the soak in the background: the suites named between
#              them run beside it on the same GPU (it holds under 2 GiB per process)
#   reliability = graph endings soak
#
# Knobs: GGV_SOAK_S (the soak's length, default 540, cut to what is left of the whole
# run minus 20 s), GGV_RELIABILITY_BUDGET_S (graph + endings, default 200).

REL=$ROOT/scripts/gpu/reliability

suite_rel_graph_endings() {
  suite_begin reliability "${1:-200}"
  local want=${2:-"graph endings"} t
  if [[ " $want " == *" graph "* ]]; then
    section "reliability: CUDA-graph capture (backend:cudaMallocAsync), SIGUSR1/SIGUSR2 during capture"
    t=$(left_s)
    [ "$t" -gt 150 ] && t=150
    if [ "$t" -ge 30 ]; then
      timeout -k 5 $((t + 10)) "$PY" "$REL/rel_check.py" graph --dir "$SW/runs/graph" --lib "$LIB" \
        --summary "$SUMMARY" --timeout "$t"
    else
      echo "graph: SKIPPED (time budget spent, ${t}s left)"
    fi
  fi
  if [[ " $want " == *" endings "* ]]; then
    section "reliability: endings (SIGTERM, SIGTERM with a handler, SIGINT)"
    t=$(left_s)
    if [ "$t" -ge 60 ]; then
      timeout -k 5 "$t" "$PY" "$REL/rel_check.py" endings --dir "$SW/runs/endings" --lib "$LIB" --summary "$SUMMARY"
    else
      echo "endings: SKIPPED (time budget spent, ${t}s left)"
    fi
  fi
  section "reliability: table"
  "$PY" "$GGV_PY" table --summary "$SUMMARY" --title "gpuguard reliability (issue 11 item 8) on the GPU"
  return 0
}

# soak_launch: starts the soak (rel_check.py soak) in the background; SOAK_PID, SOAK_DIR.
soak_launch() {
  local dur=${GGV_SOAK_S:-540} now
  now=$(date +%s)
  local left=$((TOTAL_END + 20 - now))   # validate.sh keeps 35 s after TOTAL_END for packing
  [ "$dur" -gt $((left - 20)) ] && dur=$((left - 20))
  SOAK_DIR=$WORK/soak
  rm -rf "$SOAK_DIR"
  mkdir -p "$SOAK_DIR/runs"
  : >"$SOAK_DIR/summary.jsonl"
  if [ "$dur" -lt 90 ]; then
    echo "soak: SKIPPED (only ${dur}s left)"
    SOAK_PID=
    return 0
  fi
  section "soak: ${dur}s, guarded and bare at the same time (console: soak/console.txt)"
  timeout -k 5 $((dur + 30)) "$PY" "$REL/rel_check.py" soak --dir "$SOAK_DIR/runs" --lib "$LIB" \
    --summary "$SOAK_DIR/summary.jsonl" --deadline $((now + dur)) >"$SOAK_DIR/console.txt" 2>&1 &
  SOAK_PID=$!
  echo "soak started: pid $SOAK_PID, deadline in ${dur}s"
}

soak_collect() {
  if [ -z "${SOAK_PID:-}" ]; then
    echo "soak: not running"
    return 0
  fi
  section "soak: waiting for pid $SOAK_PID"
  wait "$SOAK_PID"
  echo "soak driver exit status $?"
  SOAK_PID=
  cat "$SOAK_DIR/console.txt"
  section "soak: table"
  "$PY" "$GGV_PY" table --summary "$SOAK_DIR/summary.jsonl" --title "gpuguard soak (issue 11 item 8) on the GPU"
  return 0
}
