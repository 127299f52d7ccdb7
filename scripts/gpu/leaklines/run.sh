#!/usr/bin/env bash
# The GPU checks of issues 12 and 25 (the CPU parts are tested on the simulator).
#   scripts/gpu/leaklines/run.sh OUTDIR [WORKLOAD...]
# WORKLOAD: torch_native torch_expandable torch_async jax cupy gpt2 cost cost_jax cost_cupy
# (default: all), and rcost_torch rcost_jax rcost_cupy (only when named: report_cost.py,
# the in-process cost of one report and its window, RCOST_SECONDS (60) of blocks).
# Each leak workload runs 8 s under `gpuguard run` in default mode with snapshots every
# second (after a bare twin of the same script, for its stderr), then check.py judges
# (a) the first allocations carry Python frames, (b) the line kept each step (64 KiB;
# gpt2: a transformers GPT-2 built from a config, its last logits) is the first suspect
# of `gpuguard show`, (c) no "(code no longer alive)" frame, (d) that suspect's figure
# within 30% of the kept bytes by the framework's counter, (e) no stderr line the bare
# twin lacks; `cost` records the step cost of PyTorch's sampled recorder, and
# cost_jax / cost_cupy the steps the JAX / CuPy script makes in 8 s bare, under gpuguard,
# and under gpuguard with a snapshot a second (JAX's device memory profile is read at
# each report), COST_ROUNDS (3, at most 3) rounds of COST_SECONDS (8) in rotating order.
# Uses target/release/gpuguard (GGV_CLI to override), built elsewhere with cargo.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-target/leaklines}
shift || true
mkdir -p "$out"
gg=${GGV_CLI:-$PWD/target/release/gpuguard}
lib=${GGV_LIB:-$PWD/target/release/libgpuguard.so}
[ -x "$gg" ] || { echo "no gpuguard at $gg: cargo build --release first" >&2; exit 2; }
here=scripts/gpu/leaklines
all=(torch_native torch_expandable torch_async jax cupy gpt2 cost cost_jax cost_cupy)
[ $# -gt 0 ] && all=("$@")
one() { # NAME SCRIPT [ENV...]
    local name=$1 script=$2 d="$out/$1"
    shift 2
    rm -rf "$d" && mkdir -p "$d"
    # The bare twin first: the stderr lines the script prints without gpuguard.
    env "$@" python3 "$script" 8 >"$d/bare_stdout.txt" 2>"$d/bare_stderr.txt"
    env "$@" GPUGUARD_DIR="$d" GPUGUARD_SNAPSHOT_EVERY=1s "$gg" run -- python3 "$script" 8 \
        >"$d/stdout.txt" 2>"$d/stderr.txt"
    echo "$name: run exit $?"
    "$gg" show "$d"/gpuguard.*.json >"$d/show.txt"
    python3 $here/check.py "$d" "$script" "$gg" | tee "$d/check.json"
}
for w in "${all[@]}"; do
    case $w in
        torch_native) one "$w" $here/leak_small.py PYTORCH_CUDA_ALLOC_CONF= ;;
        torch_expandable) one "$w" $here/leak_small.py PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
        torch_async) one "$w" $here/leak_small.py PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
        jax) one "$w" $here/leak_small_jax.py ;;
        cupy) one "$w" $here/leak_small_cupy.py ;;
        gpt2) one "$w" $here/leak_gpt2.py PYTORCH_CUDA_ALLOC_CONF= ;;
        cost)
            # (d) the recorder's own cost, and the process under gpuguard with and
            # without the sampling windows (snapshots every second vs none).
            d="$out/cost" && mkdir -p "$d"
            python3 $here/step_cost.py >"$d/recorder.json"
            GPUGUARD_DIR="$d" GPUGUARD_SNAPSHOT_EVERY=1s "$gg" run -- python3 $here/step_cost.py >"$d/sampling.json"
            GPUGUARD_DIR="$d" "$gg" run -- python3 $here/step_cost.py >"$d/default.json"
            cat "$d"/*.json ;;
        cost_jax | cost_cupy)
            script=$here/leak_small_${w#cost_}.py d="$out/$w" secs=${COST_SECONDS:-8}
            mkdir -p "$d"
            local_orders=("bare gg gg_snap" "gg gg_snap bare" "gg_snap bare gg")
            for round in $(seq "${COST_ROUNDS:-3}"); do
                for v in ${local_orders[$((round - 1))]}; do
                    case $v in
                        bare) python3 "$script" "$secs" ;;
                        gg) GPUGUARD_DIR="$d" "$gg" run -- python3 "$script" "$secs" 2>/dev/null ;;
                        gg_snap) GPUGUARD_DIR="$d" GPUGUARD_SNAPSHOT_EVERY=1s "$gg" run -- python3 "$script" "$secs" 2>/dev/null ;;
                    esac | awk -v r=$round -v v=$v '/^steps /{print "COST round=" r " variant=" v " steps=" $2}'
                done
            done | tee "$d/cost.txt"
            rm -f "$d"/gpuguard.*.json ;;
        rcost_torch | rcost_jax | rcost_cupy)
            # (d) in process: blocks with and without one report (SIGUSR1) at their
            # start, ABBA, about 1 s each; the per-report cost with its interval.
            d="$out/$w" && mkdir -p "$d"
            GPUGUARD_DIR="$d" LD_PRELOAD="$lib" python3 $here/report_cost.py "${w#rcost_}" \
                --seconds "${RCOST_SECONDS:-60}" >"$d/stdout" 2>"$d/stderr"
            python3 $here/../../bench/ab_analyze.py "$d/stdout" | tee "$d/ab.txt"
            # What each report says it cost the main thread (python_cost), summarized.
            python3 - "$d" <<'PYEOF' | tee "$d/python_cost.txt"
import glob, json, statistics, sys
ms, win = [], {}
for p in glob.glob(sys.argv[1] + "/gpuguard.*.json"):
    c = json.load(open(p)).get("python_cost")
    if c:
        ms.append(c["main_thread_ms"])
        for w in c.get("windows", []):
            win.setdefault(w["framework"], []).append((w["ms"], w.get("allocations")))
if ms:
    q = statistics.quantiles(ms, n=10) if len(ms) > 1 else ms * 9
    print("PYCOST reports=%d main_thread_ms median=%.2f p10=%.2f p90=%.2f max=%.2f"
          % (len(ms), statistics.median(ms), q[0], q[-1], max(ms)))
for f, ws in sorted(win.items()):
    n = [a for _, a in ws if a is not None]
    print("PYCOST window=%s n=%d ms_median=%.1f allocations_median=%s"
          % (f, len(ws), statistics.median(m for m, _ in ws), statistics.median(n) if n else "-"))
PYEOF
            rm -f "$d"/gpuguard.*.json ;;
        *) echo "unknown workload $w" >&2 ;;
    esac
done
